package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/relay-dev/relay/internal/buildversion"
)

// versionCmd prints what this edgectl was built from (the running edged's
// version is in `edgectl status`).
func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print edgectl's version: module version, commit, Go version and platform",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, "edgectl", buildversion.String())
			return err
		},
	}
}
