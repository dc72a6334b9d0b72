// Command machinecost measures three costs of this machine that a call
// through Talos pays many times over and that BenchmarkSeal (arithmetic:
// canonical JSON, SHA-256, Ed25519) does not see: a system call, a page
// fault on fresh anonymous memory, and the wake-up of a thread parked on a
// futex. A call crosses NATS several times; each crossing is a few system
// calls and a wake-up in every process it passes, and a process whose heap
// grows touches fresh pages. A virtual machine may charge many times what
// bare metal does for each, so two machines with the same BenchmarkSeal can
// differ twofold in the stack's throughput. `bash scripts/bench.sh` prints
// this line beside the machine's cores and memory.
//
// Usage: go run ./scripts/machinecost [-json]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"time"
)

// costs are the machine's costs, in microseconds, each the median of
// rounds.
type costs struct {
	Syscall float64 `json:"syscall_us"`
	Fault   float64 `json:"page_fault_us"`
	Wake    float64 `json:"thread_wake_us"`
}

// sizes are how much each round measures.
type sizes struct {
	rounds   int
	syscalls int
	pages    int
	wakes    int
}

// defaults take about a second here (a wake-up at 40 µs is most of it):
// bench.sh runs them in every mode.
var defaults = sizes{rounds: 5, syscalls: 20_000, pages: 4 << 10, wakes: 2_000}

func main() {
	asJSON := flag.Bool("json", false, "print the costs as a JSON object")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/machinecost [-json]\n\nMeasures this machine's cost of a system call, a page fault on fresh\nanonymous memory and a wake-up of a parked thread (medians of 5 rounds).")
		flag.PrintDefaults()
	}
	flag.Parse()
	c, err := measure(defaults)
	if err != nil {
		fmt.Fprintln(os.Stderr, "machinecost:", err)
		os.Exit(1)
	}
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(c)
		return
	}
	fmt.Println(c)
}

func (c costs) String() string {
	return fmt.Sprintf("system call %.2f µs, page fault %.2f µs, thread wake-up %.2f µs", c.Syscall, c.Fault, c.Wake)
}

// measure takes the median of s.rounds rounds of each cost.
func measure(s sizes) (costs, error) {
	var sys, fault, wake []float64
	for range s.rounds {
		sys = append(sys, perOp(s.syscalls, func() {
			for range s.syscalls {
				syscall.Getppid()
			}
		}))
		f, err := pageFault(s.pages)
		if err != nil {
			return costs{}, err
		}
		fault = append(fault, f)
		wake = append(wake, threadWake(s.wakes))
	}
	return costs{Syscall: median(sys), Fault: median(fault), Wake: median(wake)}, nil
}

// perOp is how long f takes, in microseconds per one of its n operations.
func perOp(n int, f func()) float64 {
	start := time.Now()
	f()
	return float64(time.Since(start).Nanoseconds()) / float64(n) / 1e3
}

// pageFault maps n fresh pages of anonymous memory and writes a byte into
// each: the kernel finds, zeroes and maps a page at each first write.
func pageFault(n int) (float64, error) {
	size := n * os.Getpagesize()
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	defer func() { _ = syscall.Munmap(b) }()
	step := os.Getpagesize()
	return perOp(n, func() {
		for i := 0; i < size; i += step {
			b[i] = 1
		}
	}), nil
}

// threadWake is half a round trip between two goroutines, each locked to
// a thread of its own: one sends, the other's thread, parked on a futex,
// is woken to receive, and answers.
func threadWake(n int) float64 {
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range ping {
			pong <- struct{}{}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(ping)
	return perOp(2*n, func() {
		for range n {
			ping <- struct{}{}
			<-pong
		}
	})
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
