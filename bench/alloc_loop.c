// Benchmark workload: N x (malloc(64) + free) from one call site; prints
// the nanoseconds per allocation+free pair measured around the loop.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink;

__attribute__((noinline)) static void churn(long n) {
    for (long i = 0; i < n; i++) {
        sink = malloc(64);
        free(sink);
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    churn(n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns_per_op %.1f\n", ns / n);
    return 0;
}
