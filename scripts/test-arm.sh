#!/bin/sh
# The -short tests of ARM_PKGS built for linux/arm64 and linux/arm (v7) and
# run under qemu-user, run by `make test-arm` (see the Makefile and
# docs/edge.md). A package's log is kept in .arm-tests/<arch>/ when it
# fails; the directory is removed when every package passes.
set -eu
cd "$(dirname "$0")/.."
: "${GO:=go}" "${ARM_PKGS:?}"

if ! command -v qemu-aarch64 >/dev/null || ! command -v qemu-arm >/dev/null; then
	echo "test-arm needs qemu-aarch64 and qemu-arm (Debian: apt-get install qemu-user)"
	exit 1
fi
root=$PWD/.arm-tests
rm -rf "$root"
for t in arm64:qemu-aarch64: arm:qemu-arm:7; do
	arch=${t%%:*} rest=${t#*:}
	qemu=${rest%%:*} arm=${rest#*:}
	out=$root/$arch
	mkdir -p "$out"
	echo "build $arch test binaries"
	# ARM_PKGS is a list of patterns: split on purpose.
	# shellcheck disable=SC2086
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch GOARM=$arm "$GO" test -c -o "$out/" $ARM_PKGS
	# shellcheck disable=SC2086
	for pkg in $("$GO" list -f '{{.ImportPath}}:{{.Dir}}:{{.Name}}' $ARM_PKGS); do
		path=${pkg%%:*} dir=${pkg#*:}
		name=${dir#*:} dir=${dir%%:*}
		if [ ! -f "$out/$name.test" ]; then
			echo "no tests  $arch $path"
			continue
		fi
		start=$(date +%s)
		if ! (cd "$dir" && "$qemu" "$out/$name.test" -test.short -test.count=1 -test.timeout=10m >"$out/$name.log" 2>&1); then
			tail -50 "$out/$name.log"
			echo "FAIL      $arch $path"
			exit 1
		fi
		echo "ok        $arch $path ($(($(date +%s) - start))s under $qemu)"
	done
done
rm -rf "$root"
