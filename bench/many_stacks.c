// Benchmark workload: N distinct call stacks (default 10,000; at most
// 131,072), binary paths through two recursive functions, one malloc each;
// prints the nanoseconds per call (each the first of its stack).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink;
#define DEPTH 17

__attribute__((noinline)) void left(int depth, unsigned bits);
__attribute__((noinline)) void right(int depth, unsigned bits);

static void step(int depth, unsigned bits) {
    if (depth == DEPTH) { sink = malloc(32); free(sink); return; }
    if (bits & (1u << depth)) right(depth + 1, bits); else left(depth + 1, bits);
}
__attribute__((noinline)) void left(int depth, unsigned bits) { step(depth, bits); __asm__ volatile(""); }
__attribute__((noinline)) void right(int depth, unsigned bits) { step(depth, bits); __asm__ volatile(""); }

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 10000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    unsigned bits = 0;
    for (; bits < n && bits < (1u << DEPTH); bits++) step(0, bits);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("ns_per_call %.1f\n", ns / (bits ? bits : 1));
    return 0;
}
