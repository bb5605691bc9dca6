// memprof's demo workload: a toy request handler with a few allocation
// sites of different sizes and counts, and a slow leak.
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#define SITE __attribute__((noinline))

static void *volatile sink;
char *leaked[4096];  // not static: the compiler must keep the leaking malloc
int nleaked;

SITE char *parse_request(int id) {
    char *text = malloc(256);
    memset(text, 'a' + id % 26, 255);
    text[255] = 0;
    return text;
}

SITE char *duplicate_header(const char *text) { return strdup(text); }

SITE void *build_response(int id) { return calloc(16, 64 + id % 8); }

SITE char *grow_log(char *log, size_t *size) {
    *size += 512;
    return realloc(log, *size);
}

SITE void remember_session(int id) {
    if (id % 10 == 0 && nleaked < 4096) leaked[nleaked++] = malloc(1024);  // never freed
}

SITE void handle(int id, char **log, size_t *log_size) {
    char *request = parse_request(id);
    char *header = duplicate_header(request);
    void *response = build_response(id);
    *log = grow_log(*log, log_size);
    remember_session(id);
    sink = response;
    free(response);
    free(header);
    free(request);
}

int main(int argc, char **argv) {
    int requests = argc > 1 ? atoi(argv[1]) : 20000;
    char *log = NULL;
    size_t log_size = 0;
    for (int id = 0; id < requests; id++) {
        handle(id, &log, &log_size);
        if (log_size > 64 * 1024) {
            free(log);
            log = NULL;
            log_size = 0;
        }
    }
    free(log);
    return 0;
}
