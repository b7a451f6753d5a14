// Command gen writes the channel streams of testdata/channels:
//
//	go generate ./examples/channels
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/idemkit/idem/examples/channels"
)

func main() {
	out := flag.String("out", "testdata/channels", "directory to write <channel>/{orders.json,stream.jsonl,expected.json} into")
	flag.Parse()
	for _, name := range channels.ChannelNames() {
		f, err := channels.Generate(name, channels.TestKeys())
		if err == nil {
			err = f.Write(*out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %v\n", name, f.Expected.Fields)
	}
}
