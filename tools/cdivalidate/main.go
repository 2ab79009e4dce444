// cdivalidate loads CDI spec files with the official CDI Go library (tags.cncf.io/container-device-interface),
// which parses strictly, checks vendor/class/device names and edits, and rejects a cdiVersion lower than the
// content requires. Exit status 1 if any file fails.
package main

import (
	"fmt"
	"os"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdivalidate SPEC...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		spec, err := cdi.ReadSpec(path, 0)
		if err != nil {
			fmt.Printf("%s: INVALID: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: ok (kind %s, cdiVersion %s, %d devices)\n", path, spec.GetClass(), spec.Version, len(spec.Devices))
	}
	if failed {
		os.Exit(1)
	}
}
