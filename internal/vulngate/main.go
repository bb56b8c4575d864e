package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vulngate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	acceptedPath := fs.String("accepted", "", "file of accepted vulnerabilities (`GO-YYYY-NNNN reason` per line)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	accepted := map[string]string{}
	if *acceptedPath != "" {
		f, err := os.Open(*acceptedPath)
		if err != nil {
			fmt.Fprintln(stderr, "vulngate:", err)
			return 2
		}
		accepted, err = parseAccepted(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "vulngate: %s: %v\n", *acceptedPath, err)
			return 2
		}
	}
	s, err := parseScan(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "vulngate:", err)
		return 2
	}
	if !judge(stdout, s, accepted) {
		return 1
	}
	return 0
}
