// An allocbench-like workload for `cargo xtask bench --monitor-budget-only`:
// SLOTS live blocks; each operation frees one block (chosen at random) and
// allocates another in its place (16 B to 4 KiB, mostly small), writes it,
// and does WORK steps of work of its own. Runs SECS seconds, prints the
// operations (each one malloc and one free) per second, per second after
// its first 5 s, and in all, then stays LINGER seconds without allocating.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 4096

static volatile unsigned long work_sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void work(long steps) {
    unsigned long x = work_sink;
    for (long i = 0; i < steps; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    work_sink = x;
}

static unsigned long rng = 88172645463325252UL;
static unsigned long next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

// Mostly small blocks, a few large: 16 B << (0..8).
static size_t size_of_next(void) {
    unsigned long r = next();
    return (16 + (r & 15) * 8) << ((r >> 8) % 64 < 56 ? (r >> 16) % 3 : 3 + (r >> 16) % 5);
}

static double steady_since;
static long steady_ops;

__attribute__((noinline)) long churn(double secs, long steps, char **slots) {
    double start = now(), end = start + secs;
    long ops = 0;
    while (now() < end) {
        if (steady_since == 0 && now() >= start + 5) {
            steady_since = now();
            steady_ops = ops;
        }
        for (int i = 0; i < 256; i++) {
            unsigned slot = next() % SLOTS;
            free(slots[slot]);
            size_t size = size_of_next();
            slots[slot] = malloc(size);
            memset(slots[slot], (int)i, size < 64 ? size : 64);
            work(steps);
        }
        ops += 256;
    }
    return ops;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 10.0;
    long steps = argc > 2 ? atol(argv[2]) : 100;
    double linger = argc > 3 ? atof(argv[3]) : 0.0;
    static char *slots[SLOTS];
    for (int i = 0; i < SLOTS; i++) slots[i] = malloc(size_of_next());
    double started = now();
    long ops = churn(secs, steps, slots);
    double ended = now();
    double steady = steady_since ? (ops - steady_ops) / (ended - steady_since) : 0;
    printf("%.0f %.0f %ld\n", ops / (ended - started), steady, ops + SLOTS);
    fflush(stdout);
    usleep((useconds_t)(linger * 1e6));
    return 0;
}
