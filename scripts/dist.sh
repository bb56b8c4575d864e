#!/bin/sh
# Release binaries, run by `make dist`: each command in DIST_CMDS built
# static (no cgo), trimmed and stamped with DIST_LDFLAGS for each platform
# in DIST_PLATFORMS (os/arch or os/arm/version) into dist/<os>-<arch>/,
# then dist/SHA256SUMS. The Makefile sets every variable.
set -eu
cd "$(dirname "$0")/.."
: "${GO:=go}" "${DIST_PLATFORMS:?}" "${DIST_CMDS:?}" "${DIST_LDFLAGS:?}"

rm -rf dist
for p in $DIST_PLATFORMS; do
	os=${p%%/*} rest=${p#*/}
	arch=${rest%%/*} arm=
	case $rest in */*) arm=${rest#*/} ;; esac
	dir=dist/$os-$arch${arm:+v$arm}
	mkdir -p "$dir"
	for c in $DIST_CMDS; do
		echo "build $dir/$c"
		CGO_ENABLED=0 GOOS=$os GOARCH=$arch GOARM=$arm "$GO" build -buildvcs=true -trimpath \
			-ldflags "$DIST_LDFLAGS" -o "$dir/$c" "./cmd/$c"
	done
done
(cd dist && sha256sum */* >SHA256SUMS)
cat dist/SHA256SUMS
ls -l dist/*/ | awk 'NF > 5 { print $5, $9 } /:$/ { print }'
