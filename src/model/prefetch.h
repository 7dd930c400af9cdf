/* prefetch.h: one sequential read of a model's weight files before they are used, with
 * progress (anna_model_options.progress).
 *
 * Weights are mmap'd (formats/safetensors.c, formats/gguf.c); on a cold page cache the first
 * pass over them (a CPU forward, a device upload, a repack) faults pages in in the order the
 * tensors are used. Reading each file once, front to back, first fills the page cache at the
 * disk's sequential speed and lets the caller show how far it got. The read is advisory: a
 * file that cannot be opened or read ends the pass early (the load itself then reports the
 * real error, naming the file), so this never fails a load.
 *
 * Files: a GGUF path is itself; a folder's *.safetensors files, and those one folder down
 * (speech_tokenizer/ of Qwen3-TTS and the like), in name order.
 */
#ifndef ANNA_MODEL_PREFETCH_H
#define ANNA_MODEL_PREFETCH_H

#include <stdint.h>

typedef void (*model_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Reads the files of path (is_gguf: a file, else a folder). progress (may be NULL) gets
 * (0, total) first, then (done, total) after every read chunk (at most every 64 MiB, and at
 * the end of each file), and finally (total, total), even when the pass ended early.
 * Returns the bytes read. */
uint64_t model_prefetch(const char *path, int is_gguf, model_progress_fn progress, void *user);

#endif
