//go:build !linux

package segstore

import "errors"

var errNoTags = errors.New("digest tags need linux extended attributes")

func setTag(string, []byte) error { return errNoTags }

func getTag(string) ([]byte, error) { return nil, errNoTags }
