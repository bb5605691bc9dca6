// Benchmark workload for unwinding: N x (malloc(64) + free) from one call
// site DEPTH calls below main (argv[2], default 6), built without frame
// pointers. With main and glibc's three frames above it (down to _start)
// the stack at malloc is DEPTH + 5 frames deep: 11 by default. Prints the
// nanoseconds per allocation+free pair measured around the loop.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink;
static volatile int keep;

__attribute__((noinline)) static void churn(long n) {
    for (long i = 0; i < n; i++) {
        sink = malloc(64);
        free(sink);
    }
}

// Not a tail call (the add after it), so each level keeps its frame.
__attribute__((noinline)) static void descend(int depth, long n) {
    if (depth <= 1)
        churn(n);
    else
        descend(depth - 1, n);
    keep += depth;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int depth = argc > 2 ? atoi(argv[2]) : 6;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    descend(depth, n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns_per_op %.1f\n", ns / n);
    return 0;
}
