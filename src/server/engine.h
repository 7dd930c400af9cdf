/* engine.h: the one thread that owns the model context and every sequence.
 *
 * Connection threads build a gen_request (prompt ids + sampling options), submit it, and
 * then only read its gen_choice results under the request's mutex (waiting on its condition
 * variable). The engine thread asks the scheduler (anna.h, "Scheduler": admission, token
 * budgets, chunked prefill, fairness, preemption) for each step's plan, executes it with one
 * anna_context_decode(_topk) call, samples each sequence, applies stop strings, appends
 * released text to the choice, and reports tokens and finished sequences back.
 * A request is reference counted: the creator holds one reference, the engine another
 * while any of its sequences is queued or running. Cancelling (client gone, shutdown)
 * frees its slots at the next step.
 */
#ifndef ANNA_SERVER_ENGINE_H
#define ANNA_SERVER_ENGINE_H

#include "anna/anna.h"
#include "metrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GEN_MAX_TOP 20
#define GEN_MAX_STOP 4

/* engine_options.spec_drafter; the values are the metrics' METRICS_DRAFTER_* */
enum { ENGINE_DRAFTER_NGRAM, ENGINE_DRAFTER_MTP, ENGINE_DRAFTER_DRAFT };
extern const char *const engine_drafter_names[3]; /* "ngram", "mtp", "draft" */

typedef struct engine_options {
  int n_seq, n_ctx, n_batch, n_threads; /* context shape (anna_context_options) */
  int max_batch_size;                   /* running sequences (<= n_seq) */
  int batch_wait_ms;                    /* coalescing wait before admitting into an idle engine */
  int max_prefill_tokens;               /* prompt tokens per step (0: what the step has room for) */
  int max_decode_tokens; /* cached tokens over one step's decode sequences (0: off) */
  int max_waiting; /* queued sequences before submit fails with ANNA_EBUSY-like ERANGE (0: off) */
  int max_queue_wait_ms; /* fairness: an older waiter forces admission beyond max_batch_size (0:
                            off) */
  int prefill_interval_steps; /* while sequences decode, add prompt chunks every N steps (<= 1:
                                 every step) */
  int prompt_cache; /* prefix block pool: finished sequences leave their KV blocks (and GDN
                       state snapshots) cached; a new prompt reuses its longest cached prefix */
  int prompt_cache_block; /* GDN models: snapshot the recurrent state every N prompt tokens
                             (rounded to KV blocks; the KV block shrinks to divide it, >= 16) */
  int prompt_cache_checkpoints; /* GDN state snapshot slots (least recently used first) */
  int prompt_cache_size;        /* exact prompt cache: whole prompts (KV + state + last logits) */
  int prompt_cache_max_tokens;  /* only prompts up to this many tokens go there (0: no limit) */
  int prefix_min_tail; /* a prompt reusing a cached prefix still computes at least its last N
                          tokens (all of a shorter prompt) in one prefill chunk, so its rows take
                          the matmul path a cold prefill of the prompt takes (quantized CPU
                          matmuls of fewer than 32 tokens sum in another order): the same request
                          gives the same logits warm or cold. 0: reuse up to the last token. */
  int kv_block_len;             /* KV block length (0: 64) */
  int kv_blocks; /* KV pool size (0: every slot and exact entry can reach n_ctx); smaller
                    pools preempt sequences (recomputed later) when the running set outgrows it */
  int kv_cache_residual_len;    /* anna_context_options.kv_cache_residual_len */
  int64_t mm_cache_bytes;       /* anna_context_options.mm_cache_bytes (0 default, < 0 off) */
  int debug_step_delay_ms;      /* testing hook: sleep this long after every step */
  const char *device;           /* anna_context_options.device (borrowed) */
  const char *layer_split;      /* anna_context_options.layer_split (borrowed) */
  int tensor_parallel;          /* anna_context_options.tensor_parallel */
  const char *tp_comm;          /* anna_context_options.tp_comm (borrowed) */
  const char *kv_cache_quantization; /* anna_context_options (borrowed) */
  int kv_cache_quant_bits;
  int exact_matmul; /* anna_context_options.exact_matmul */
  /* --deterministic: prompts cut at fixed 64-token boundaries (anna_sched_options.chunk_align;
   * 64 is the Gated DeltaNet chunk and the default KV block) so that, with the batch-invariant
   * kernels the flag also turns on, a request's output does not depend on the others. */
  int deterministic;
  /* Download every logits row and sample it on the host (the reference path) instead of
   * sampling from the backend's top-k candidates (anna-generate's --host-sampling). */
  int host_sampling;
  const char *tuning; /* anna_context_options.tuning: "k=v,..." (borrowed; NULL: none) */
  /* MoE expert offload: anna_context_options' fields of the same names (anna.h) */
  const char *offload_mode;
  int64_t gpu_memory_limit, expert_cache_bytes, host_memory_limit, reserve_bytes;
  int cached_experts_per_layer, expert_swap_every;
  /* (0, 1]: size the KV pool (instead of kv_blocks, which must be 0) so that anna uses at
   * most this fraction of the device's total memory: a probe context with the smallest pool
   * measures what the model and scratch leave free, then the real context takes
   * free - (1 - F) * total in blocks (anna_context_memory). 0: off. A backend that cannot
   * report its memory (the CPU) is an error. */
  float gpu_memory_utilization;
  /* Speculative decoding with the n-gram (prompt lookup) drafter, anna-serve --speculative
   * ngram: up to spec_draft_max (1..ANNA_SPEC_MAX_DRAFT; 0: off) drafted tokens per decoding
   * sequence verified in one window (anna_context_verify), suffixes of spec_ngram_min..max
   * tokens matched. Only greedy choices without penalties, logprobs, JSON / forced output or
   * images take windows (the window's argmax is the greedy choice, so outputs are those of
   * plain decoding); the others decode as before in the same step. */
  int spec_draft_max, spec_ngram_min, spec_ngram_max;
  /* With drafters (spec_draft_max > 0): spec_default 1 makes requests speculate unless they
   * say "speculative": false (anna-serve --speculative ngram); 0 only those that say true.
   * Sampled requests and penalties take windows too (anna_context_verify_sampled: the target
   * distribution is kept, and a seed gives plain decoding's tokens). The draft length adapts
   * per sequence to its acceptance (anna_spec_adapt) up to spec_draft_max; spec_fixed 1 keeps
   * it at spec_draft_max (--draft-fixed). */
  int spec_default, spec_fixed;
  /* Which drafter (ENGINE_DRAFTER_*, anna-serve --speculative / --draft-model): the n-gram
   * drafter; the model's MTP head (anna_mtp_*: engine_create fails with ANNA_EUNSUPPORTED
   * naming the model when it has none); or a draft model loaded from spec_draft_model
   * (anna_draft_*: its vocabulary must be the target's, ANNA_EINVAL naming the first
   * difference). Model drafters follow every speculating slot from its prompt on: the
   * slot's prompt chunks run through anna_mtp_feed (a forward call of their own that keeps the
   * hidden rows; a prefix reused from the cache is not in the head) or, beside the target's
   * chunk, through the draft model (anna_draft_feed; what it lacks, a cached prefix say, it
   * catches up a bounded piece per step while the slot decodes plainly). */
  int spec_drafter;
  const char *spec_draft_model;
  /* Reserve one more context sequence for engine_embed (pooled hidden states): its KV
   * positions count in the pool like a slot's. 0: engine_embed answers ANNA_EUNSUPPORTED. */
  int embeddings;
  /* --engine-profile S: every S seconds (0: never) log where the engine thread's time went
   * over the interval (phases per step, rows, model calls, CUDA graph steps; metrics.h's
   * ENG_PH_*). The same figures are always kept in /metrics (anna_engine_*). */
  int profile_interval_s;
  /* A step with both decode and prompt rows runs them as two model calls, the decode rows
   * first (decode-sized: CUDA graphs) instead of one mixed call (anna-serve
   * --split-prefill-decode). An experiment for issue 29: whether one mixed call or a graphed
   * decode plus a prompt chunk costs less on a given device. */
  int split_prefill;
  /* Structured-output mask workers (issue 30): the token masks (JSON mode, JSON Schema, GBNF)
   * of a step's constrained rows are computed by this many threads while the forward pass
   * runs, and applied to the logits rows by them once it returns. 0: on the engine thread
   * after the forward pass, one after another; < 0: cores / 2, at most 8. Same tokens either
   * way. */
  int mask_threads;
  /* JSON Schema mask cache budget in MiB (anna-serve --json-mask-cache-mib, default 64): a
   * state's mask is computed once and shared by every sequence using the schema
   * (jsonschema_mask_bits_cached); 0: every mask computed (same tokens either way). */
  int json_mask_cache_mib;
} engine_options;

/* One generated token with its log-probabilities (only kept when asked for). */
typedef struct gen_token {
  int32_t id;
  float logprob;
  int n_top;
  int32_t top_id[GEN_MAX_TOP];
  float top_lp[GEN_MAX_TOP];
} gen_token;

/* The output of one choice. Written by the engine, read under gen_request.mu. */
enum { GEN_SPEC_DEFAULT = 0, GEN_SPEC_ON = 1, GEN_SPEC_OFF = 2 };

typedef struct gen_choice {
  char *text; /* released text (stop strings cut, never held back past the end) */
  size_t text_len, text_cap;
  gen_token *toks; /* with logprobs only */
  size_t n_toks, cap_toks;
  int n_prompt, n_gen;
  int n_cached; /* prompt tokens a cache held when the choice started (not recomputed) */
  /* With gen_request.keep_ids: the generated token ids (the end-of-generation token
   * included), copied once when the choice finishes. Owned. */
  int32_t *gen_ids;
  size_t n_gen_ids;
  int done;
  const char *finish_reason; /* static: "stop", "length", "cancelled", "error" */
  int spec_accepted, spec_rejected; /* drafted tokens verify windows accepted / rejected */
} gen_choice;

typedef struct gen_request {
  /* Set by the creator before engine_submit; read-only afterwards. */
  char id[80];
  int n_prompts;     /* prompts (completions may batch several) */
  int32_t **prompts; /* owned */
  size_t *n_prompt;  /* owned */
  int n;             /* choices per prompt */
  int max_tokens;    /* per choice; <= 0: up to the context */
  anna_sampler_params sp; /* choice i uses seed + i */
  char *stop[GEN_MAX_STOP];
  int n_stop;
  int logprobs, top_logprobs, ignore_eos;
  /* vLLM's min_tokens: before this many generated tokens, end-of-generation tokens are
   * masked out of sampling and stop strings are not matched (0: off). */
  int min_tokens;
  /* the request's "speculative": GEN_SPEC_DEFAULT (absent: the server's default), ON, OFF;
   * engine_submit resolves DEFAULT to ON or OFF (OFF when the engine has no drafters) */
  int speculative;
  int keep_ids;  /* copy each choice's generated ids into gen_choice.gen_ids at its end */
  int json_mode; /* constrain the output to one JSON object (response_format) */
  /* With json_mode: the output (or the forced call's arguments) follows this compiled
   * schema instead of "any object". Owned reference (jsonschema_release); NULL: unused. */
  struct jsonschema *schema;
  /* The `grammar` field: the output follows this compiled GBNF grammar (never together with
   * json_mode or a forced tool call). Owned reference (gbnf_release); NULL: unused. */
  struct gbnf *grammar;
  /* Forced tool call (tool_choice naming a function): emit prefix, then a JSON-masked
   * arguments object, then suffix, then stop. Owned; NULL when unused. */
  int32_t *prefix, *suffix;
  size_t n_prefix, n_suffix;
  int32_t *forced; /* testing hook: emit these ids instead of sampling, then stop; owned */
  size_t n_forced;
  double t_arrival;
  /* Images of prompt 0 (chat): media[k] (owned, anna_media_free) stands for the run of
   * anna_media_n_tokens pad ids at prompts[0][media_at[k]]. The engine runs the tower and
   * prefills such a prompt alone when its slot starts (anna_context_prefill), outside the
   * prefix and exact prompt caches (pad ids do not identify an image). */
  anna_media **media;
  int32_t *media_at;
  int n_media;
  /* NULL: every media belongs to prompt 0 (above). Else media[k] belongs to prompt
   * media_prompt[k] and stands at prompts[media_prompt[k]][media_at[k]] (a long clip's pieces,
   * one per prompt, decoding side by side). Owned. */
  int32_t *media_prompt;
  /* Shared state. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  gen_choice *choices; /* n_prompts * n, prompt-major */
  int n_choices, n_done;
  int cancelled;   /* atomic: set by engine_cancel */
  int refs;        /* atomic */
  char error[256]; /* first engine error, when a choice ends with "error" */
  int error_code;  /* its ANNA_E* code; ANNA_ENOMEM: memory or KV blocks ran out (HTTP 503) */
  /* Engine only (eng_sched_id, eng_submitted: under the engine's mutex). */
  int eng_units;
  int eng_submitted;
  uint64_t eng_sched_id; /* the scheduler's id of choice 0; choice i is + i */
} gen_request;

/* Allocates an empty request with one reference (caller releases). */
gen_request *gen_request_new(void);
/* Allocates choices for n_prompts * n after the creator set them; 0 or ANNA_ENOMEM. */
int gen_request_prepare(gen_request *r);
void gen_request_retain(gen_request *r);
void gen_request_release(gen_request *r);

typedef struct engine engine;

/* m and text are borrowed and must outlive the engine; mx too. Starts the engine thread.
 * Caller frees with engine_free. */
int engine_create(engine **out, anna_model *m, const anna_text *text, const engine_options *o,
                  metrics *mx, char *err, size_t errlen);
/* Stops the thread (cancelling whatever is left) and frees everything. */
void engine_free(engine *e);
/* Queues r (takes an engine reference). ANNA_ERANGE: the waiting queue is full (HTTP 429);
 * ANNA_ESTATE: shutting down (HTTP 503); ANNA_EINVAL: a prompt does not fit the context;
 * ANNA_ENOMEM: out of memory, or a prompt needs more KV blocks than the whole pool (HTTP 503).
 * A sequence that later outgrows the pool even when it runs alone (nothing left to preempt)
 * ends with "error" and error_code ANNA_ENOMEM. */
int engine_submit(engine *e, gen_request *r, char *err, size_t errlen);
/* The final hidden state (anna_context_decode_hidden) of the last of ids[0, n) into
 * out[engine_hidden_size] (caller-owned), computed on the engine thread between steps on the
 * sequence reserved by engine_options.embeddings (one input at a time; the sequence is
 * emptied afterwards and registers nothing in the prefix pool). Blocks until done.
 * ANNA_EUNSUPPORTED: embeddings off or a model without hidden states; ANNA_EINVAL: n is 0 or
 * more than the context; ANNA_ESTATE: shutting down; ANNA_ERANGE / ANNA_ENOMEM: no KV blocks
 * or memory (worth a retry). */
int engine_embed(engine *e, const int32_t *ids, size_t n, float *out, char *err, size_t errlen);
int engine_hidden_size(const engine *e);
/* Asks the engine to drop r's sequences; idempotent, returns at once. */
void engine_cancel(engine *e, gen_request *r);
/* Refuses new work from now on. Returns once nothing is queued or running, or after
 * timeout_s, when the rest is cancelled. */
void engine_drain(engine *e, double timeout_s);

typedef struct engine_stats {
  int n_seq, n_ctx, running, waiting;
  int64_t kv_tokens, kv_capacity, kv_cached;
  int draining;
  anna_kv_stats kv; /* the block pool as of the last step, or of going idle */
  /* With kv: the blocks the slots' sequences / the exact-cache entries can reference
   * (ceil(length / block_len) each; an upper bound where they share blocks). Blocks in use
   * beyond both are held by nothing: leaked. */
  int64_t kv_seq_blocks, kv_exact_blocks;
  int exact_entries;
  int64_t preemptions; /* sequences preempted for KV blocks (recomputed later) */
  anna_spec_stats spec; /* verify windows, drafted and accepted tokens (speculative decoding) */
  anna_vision_stats vis; /* the encoder cache and tower (vision models; zeros otherwise) */
  /* the JSON Schema mask cache (zeros while off or before the first schema request) */
  uint64_t jmc_hits, jmc_misses, jmc_evictions, jmc_entries, jmc_bytes;
} engine_stats;
void engine_get_stats(engine *e, engine_stats *st);
const engine_options *engine_get_options(const engine *e);
/* The context's resolved runtime switches, as anna_context_tuning ("key=value" lines into
 * buf, NUL-terminated, truncated to len; returns the length the whole text needs). */
int engine_tuning(const engine *e, char *buf, size_t len);
/* The context's pipeline stages (anna_context_stage_info; one without --layer-split): up to
 * cap into out, returns how many there are. Fixed at creation: safe from any thread. */
int engine_stages(const engine *e, anna_stage_info *out, int cap);

/* Blocks until r has news (text, tokens, done) or timeout_ms passed; call with r->mu held. */
void gen_request_wait(gen_request *r, int timeout_ms);

double engine_now(void);

#endif
