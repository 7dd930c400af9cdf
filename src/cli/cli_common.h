/* cli_common.h: small helpers shared by the command-line tools (flag parsing that reports
 * what was wrong, id lists, timing). Header-only: each tool is one translation unit. */
#ifndef ANNA_CLI_COMMON_H
#define ANNA_CLI_COMMON_H

#include "anna/anna.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hub.h"

/* Inside a `for (int i = 1; i < argc; i++)` flag loop with `a` = argv[i] and `v` = argv[i+1]
 * (or NULL): takes the flag's value, or reports the missing value and returns 2 (usage). */
#define CLI_NEEDV()                                                                                                    \
  do {                                                                                                                 \
    if (!v) {                                                                                                          \
      fprintf(stderr, "error: %s needs a value\n", a);                                                                 \
      return 2;                                                                                                        \
    }                                                                                                                  \
    i++;                                                                                                               \
  } while (0)

static inline double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Model-load progress (anna_model_options.progress): on a terminal a bar redrawn in place
 * (at most 10 times a second) while the weight files are read; otherwise one summary line
 * when a read that took a second or more is done (anna-serve logs every read its own way).
 * Set opt->progress = cli_load_progress, opt->progress_user = a zeroed cli_progress that
 * outlives the load. */
typedef struct cli_progress {
  double t0, last;
  int tty; /* -1 until the first call: isatty(2) then */
} cli_progress;

static inline void cli_load_progress(void *user, uint64_t done, uint64_t total) {
  cli_progress *p = user;
  const double now = cli_now();
  if (done == 0 || p->t0 == 0) {
    p->t0 = now;
    p->last = 0;
    p->tty = isatty(2);
  }
  const double mib = 1024.0 * 1024.0, dt = now - p->t0;
  const double rate = dt > 0 ? (double)done / mib / dt : 0;
  if (p->tty) {
    if (done < total && now - p->last < 0.1 && done != 0) return;
    p->last = now;
    const int width = 30, fill = total ? (int)((double)width * (double)done / (double)total) : width;
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r[anna] loading weights [%s] %3d%%  %.1f / %.1f MiB  %.0f MiB/s ", bar,
            total ? (int)(100.0 * (double)done / (double)total) : 100, (double)done / mib, (double)total / mib, rate);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
  } else if (done >= total && dt >= 1.0) {
    /* Only a read that took a noticeable time is worth a line in a log; a small model's
     * load stays silent, so scripts reading merged stdout+stderr see the output first. */
    fprintf(stderr, "[anna] read %.1f MiB of weights in %.2f s (%.0f MiB/s)\n", (double)total / mib, dt, rate);
  }
}

/* --weight-quant none|auto|int4 (anna_model_options.weight_quant); prints the error and
 * returns -1 for anything else. */
static inline int cli_weight_quant(const char *flag, const char *v) {
  if (v && (!strcmp(v, "none") || !strcmp(v, "auto") || !strcmp(v, "int4"))) return 0;
  fprintf(stderr, "error: %s expects none, auto or int4, got '%s'\n", flag, v ? v : "");
  return -1;
}

/* --device, --layer-split and --list-devices (anna_context_options.device / .layer_split,
 * anna_devices_list): the usage lines every tool that runs a text model prints. */
#define CLI_DEVICE_USAGE                                                                                               \
  "  --device D             cpu (default), cuda, cuda:N (the N-th GPU CUDA_VISIBLE_DEVICES leaves), auto;\n"     \
  "                         with --layer-split one per stage (cuda:0,cuda:1) or one that every stage shares\n"     \
  "  --layer-split S        pipeline stages: auto (one per device) or consecutive layer counts N,N,...\n"           \
  "  --tensor-parallel N    N shards of every layer (heads, intermediate columns), one per device of --device\n"   \
  "                         (cuda:0,cuda:1) or N on one device (cpu, cuda:0); not with --layer-split\n"        \
  "  --tp-comm C            the shards' all-reduce: auto (default: nccl on distinct GPUs when built), host, nccl\n" \
  "  --list-devices         print the devices this build can use (name, memory) and exit\n"

/* --list-devices: one line per device on stdout; returns 0 (the tool's exit status). */
static inline int cli_list_devices(void) {
  char buf[4096];
  anna_devices_list(buf, sizeof buf);
  fputs(buf, stdout);
  return 0;
}

/* The placement of a layer split on stderr, one line per stage (nothing for one stage). */
static inline void cli_print_stages(const anna_context *c) {
  const int n = anna_context_stage_count(c);
  for (int i = 0; n > 1 && i < n; i++) {
    anna_stage_info si;
    if (anna_context_stage_info(c, i, &si, NULL, 0)) continue;
    fprintf(stderr, "stage %d: %s, layers %d..%d, weights %.1f MiB, kv %.1f MiB\n", i, si.device, si.layer_begin,
            si.layer_end - 1, (double)si.weight_bytes / 1048576.0, (double)si.kv_bytes / 1048576.0);
  }
}

/* Parses an int flag value in [lo, hi]; prints the error and returns -1 on failure. */
static inline int cli_int(const char *flag, const char *v, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || errno || *end || end == v || x < lo || x > hi) {
    fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v ? v : "");
    return -1;
  }
  *out = (int)x;
  return 0;
}

static inline int cli_float(const char *flag, const char *v, double lo, double hi, float *out) {
  char *end;
  errno = 0;
  double x = v ? strtod(v, &end) : 0;
  if (!v || errno || *end || end == v || !(x >= lo && x <= hi)) {
    fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, v ? v : "");
    return -1;
  }
  *out = (float)x;
  return 0;
}

/* "5,17,3" -> ids (caller frees). Returns count or -1 (message printed). */
static inline long cli_ids(const char *flag, const char *v, int32_t **out) {
  *out = NULL;
  if (!v || !*v) {
    fprintf(stderr, "error: %s expects a comma-separated list of token ids\n", flag);
    return -1;
  }
  size_t cap = 1;
  for (const char *p = v; *p; p++) cap += *p == ',';
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return -1;
  long n = 0;
  const char *p = v;
  while (*p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
      fprintf(stderr, "error: %s: bad token id at '%s'\n", flag, p);
      free(ids);
      return -1;
    }
    ids[n++] = (int32_t)x;
    p = *end ? end + 1 : end;
  }
  *out = ids;
  return n;
}

/* A byte size: a number with an optional binary or decimal unit (B, K/KB/KiB, M/MB/MiB,
 * G/GB/GiB, T/TB/TiB; K/M/G/T alone and *iB are powers of 1024, KB/MB/GB/TB powers of 1000),
 * e.g. "8GiB", "512M", "1.5G", "4096". Prints the error and returns -1 on failure. */
static inline int cli_size(const char *flag, const char *v, int64_t *out) {
  char *end;
  errno = 0;
  double x = v ? strtod(v, &end) : -1;
  if (!v || errno || end == v || !(x >= 0)) goto bad;
  {
    double mul = 1;
    const char *u = end;
    static const char units[] = "KMGT";
    const char *p = *u ? strchr(units, (*u >= 'a' && *u <= 'z') ? *u - 32 : *u) : NULL;
    if (*u && *u != 'B' && *u != 'b' && !p) goto bad;
    if (p) {
      const int pw = (int)(p - units) + 1;
      u++;
      const int dec = (*u == 'B' || *u == 'b') && u[1] == 0;
      if (*u == 'i' && (u[1] == 'B' || u[1] == 'b') && u[2] == 0) u += 2;
      else if (dec) u++;
      else if (*u) goto bad;
      for (int k = 0; k < pw; k++) mul *= dec ? 1000.0 : 1024.0;
    } else if (*u) {
      u++;
      if (*u) goto bad;
    }
    x *= mul;
    if (x > 9.0e18) goto bad;
    *out = (int64_t)x;
    return 0;
  }
bad:
  fprintf(stderr, "error: %s expects a size such as 8GiB, 512MiB or a byte count, got '%s'\n", flag, v ? v : "");
  return -1;
}

/* The MoE expert offload flags (anna_context_options.offload_mode and the sizes after it),
 * the same on anna-generate, anna-bench and anna-serve. */
#define CLI_OFFLOAD_USAGE                                                                                             \
  "  --offload-mode M       MoE expert offload (cuda): none (default), experts, auto (on when a limit below is "   \
  "set)\n"                                                                                                         \
  "  --gpu-memory-limit SIZE  device bytes this run may use (e.g. 8GiB; default: the free memory)\n"              \
  "  --expert-cache auto|SIZE  device bytes of the expert cache (auto: what the limit leaves)\n"                   \
  "  --host-memory-limit SIZE  pinned host mirror of the experts (default: all; 0: none, read from the file)\n"    \
  "  --cached-experts-per-layer N  expert cache slots per MoE layer (instead of --expert-cache)\n"                  \
  "  --expert-swap-every N  decode steps between adaptive expert swaps (default 8; alias --adapt-every)\n"         \
  "  --reserve-memory-mib N  device memory left unused by the expert cache (alias --min-free-memory-mib)\n"
typedef struct cli_offload {
  const char *mode;
  int64_t gpu_limit, cache, host_limit, reserve;
  int host_set, per_layer, swap_every;
} cli_offload;

/* One offload flag at argv[*i] (value argv[*i + 1]): 1 taken (*i advanced), 0 not an offload
 * flag, -1 bad (message printed). */
static inline int cli_offload_arg(cli_offload *o, int argc, char **argv, int *i) {
  const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  static const char *const flags[] = {"--offload-mode", "--gpu-memory-limit", "--expert-cache",
                                      "--host-memory-limit", "--cached-experts-per-layer", "--expert-swap-every",
                                      "--adapt-every", "--reserve-memory-mib", "--min-free-memory-mib",
                                      "--resident-expert-layers"};
  int f = -1;
  for (int k = 0; k < (int)(sizeof flags / sizeof flags[0]); k++)
    if (!strcmp(a, flags[k])) f = k;
  if (f < 0) return 0;
  if (!v) {
    fprintf(stderr, "error: %s needs a value\n", a);
    return -1;
  }
  (*i)++;
  int mib = 0;
  switch (f) {
  case 0:
    if (strcmp(v, "none") && strcmp(v, "experts") && strcmp(v, "auto")) {
      fprintf(stderr, "error: %s expects auto, none or experts, got '%s'\n", a, v);
      return -1;
    }
    o->mode = v;
    return 1;
  case 1: return cli_size(a, v, &o->gpu_limit) ? -1 : 1;
  case 2:
    if (!strcmp(v, "auto")) {
      o->cache = -1;
      if (!o->mode) o->mode = "experts"; /* asked for a cache: on, sized by the limit or free memory */
      return 1;
    }
    if (cli_size(a, v, &o->cache)) return -1;
    if (!o->cache) {
      fprintf(stderr, "error: %s 0: use --offload-mode none to keep every expert on the device\n", a);
      return -1;
    }
    return 1;
  case 3:
    o->host_set = 1;
    return cli_size(a, v, &o->host_limit) ? -1 : 1;
  case 4: return cli_int(a, v, 1, 1 << 20, &o->per_layer) ? -1 : 1;
  case 5:
  case 6: return cli_int(a, v, 1, 1 << 20, &o->swap_every) ? -1 : 1;
  case 7:
  case 8:
    if (cli_int(a, v, 0, 1 << 30, &mib)) return -1;
    o->reserve = (int64_t)mib << 20;
    return 1;
  default:
    fprintf(stderr, "error: %s is not supported yet (every MoE layer shares the expert cache; use "
                    "--cached-experts-per-layer)\n",
            a);
    return -1;
  }
}

/* Into the context options: "auto" unless a mode was given; the host limit's CLI meaning
 * (0: no mirror) in the API's (0: everything, < 0: none). */
static inline void cli_offload_apply(const cli_offload *o, anna_context_options *co) {
  co->offload_mode = o->mode ? o->mode : "auto";
  co->gpu_memory_limit = o->gpu_limit;
  co->expert_cache_bytes = o->cache > 0 ? o->cache : 0;
  co->host_memory_limit = !o->host_set ? 0 : o->host_limit > 0 ? o->host_limit : -1;
  co->reserve_bytes = o->reserve;
  co->cached_experts_per_layer = o->per_layer;
  co->expert_swap_every = o->swap_every;
}

/* --hf-repo ORG/NAME[:FILE|:TAG] (spec; NULL: the flag was not given): resolves it through the
 * Hugging Face Hub cache, downloading what it lacks (src/hub/hub.h: HF_ENDPOINT, HF_TOKEN,
 * HF_HOME, HF_HUB_OFFLINE), and sets *model to the local folder or file (valid until exit: the
 * path is freed by an atexit handler, so a tool needs no cleanup for it). --hf-repo together
 * with a --model / --model-dir is an error. Returns 0, or 1 with the message printed. */
static char *cli_hf_path_ __attribute__((unused));
__attribute__((unused)) static void cli_hf_free_(void) {
  free(cli_hf_path_);
  cli_hf_path_ = NULL;
}
static inline int cli_hf_model(const char *spec, const char **model) {
  if (!spec) return 0;
  if (*model) {
    fprintf(stderr, "error: give --hf-repo or --model / --model-dir, not both\n");
    return 1;
  }
  char err[1024];
  if (cli_hf_path_ || hub_fetch(spec, NULL, &cli_hf_path_, err, sizeof err)) {
    fprintf(stderr, "error: --hf-repo %s: %s\n", spec, cli_hf_path_ ? "given twice" : err);
    return 1;
  }
  atexit(cli_hf_free_);
  *model = cli_hf_path_;
  return 0;
}

#endif
