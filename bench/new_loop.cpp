// Benchmark workload: N x (new long[8] + delete[]) from one call site;
// prints the nanoseconds per new+delete pair measured around the loop.
#include <cstdio>
#include <cstdlib>
#include <ctime>

static long *volatile sink;

__attribute__((noinline)) static void churn(long n) {
    for (long i = 0; i < n; i++) {
        sink = new long[8];
        delete[] sink;
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    churn(n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns_per_op %.1f\n", ns / n);
    return 0;
}
