// bench.h: what several benchmarks print about the machine they run on.
#ifndef TRIDENT_BENCH_H
#define TRIDENT_BENCH_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

// Which of avx512_bf16 / amx_bf16 the first "flags" line of /proc/cpuinfo
// names ("none" when neither).
static void bench_cpu_bf16_flags(char *out, size_t len) {
    snprintf(out, len, "none");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        bool avx = strstr(line, " avx512_bf16") != NULL, amx = strstr(line, " amx_bf16") != NULL;
        if (avx || amx) snprintf(out, len, "%s%s%s", avx ? "avx512_bf16" : "", avx && amx ? " " : "",
                                 amx ? "amx_bf16" : "");
        break;
    }
    fclose(f);
}

#endif
