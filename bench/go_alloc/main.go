// Allocates N objects of 64 bytes (default 1,000,000), each through
// runtime.mallocgc, keeping the last 1,024: the Go allocation loop of
// `cargo xtask bench --go-only`. With GO_BENCH_MEMPROFILE=1, Go records
// every allocation in its own heap profile (MemProfileRate 1).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
)

var ring [1024][]byte

//go:noinline
func allocate(n int) {
	for i := 0; i < n; i++ {
		ring[i%len(ring)] = make([]byte, 64)
	}
}

func main() {
	if os.Getenv("GO_BENCH_MEMPROFILE") == "1" {
		runtime.MemProfileRate = 1
	}
	n := 1000000
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	allocate(n)
	fmt.Println(len(ring[0]))
}
