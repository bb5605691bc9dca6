// Benchmark workload: 10,000 distinct call stacks (binary paths through
// two recursive functions), one malloc each.
#include <stdlib.h>

static void *volatile sink;
#define DEPTH 14

__attribute__((noinline)) void left(int depth, unsigned bits);
__attribute__((noinline)) void right(int depth, unsigned bits);

static void step(int depth, unsigned bits) {
    if (depth == DEPTH) { sink = malloc(32); free(sink); return; }
    if (bits & (1u << depth)) right(depth + 1, bits); else left(depth + 1, bits);
}
__attribute__((noinline)) void left(int depth, unsigned bits) { step(depth, bits); __asm__ volatile(""); }
__attribute__((noinline)) void right(int depth, unsigned bits) { step(depth, bits); __asm__ volatile(""); }

int main(void) {
    for (unsigned bits = 0; bits < 10000; bits++) step(0, bits);
    return 0;
}
