/* tok_vocab.c: builds a tokenizer from the vocabulary description GGUF metadata carries.
 * The pipeline a tokenizer.json would spell out is implied here by the model kind and the
 * "pre" name, matching what the Hugging Face files of those models say. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
    "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int add_split(tokenizer *t, const char *re, size_t n, char *err, size_t errlen) {
  tok_step *st = tok_pipe_push(&t->pre, TOK_PRE_SPLIT);
  if (!st) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  st->behavior = TOK_SPLIT_ISOLATED;
  return tok_regex_compile(&st->re, re, n, err, errlen);
}

static int add_bytelevel(tokenizer *t, int use_regex, char *err, size_t errlen) {
  tok_step *st = tok_pipe_push(&t->pre, TOK_PRE_BYTELEVEL);
  if (!st || !tok_pipe_push(&t->dec, TOK_DEC_BYTELEVEL))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  st->use_regex = use_regex;
  return use_regex ? tok_gpt2_regex(&st->re, err, errlen) : 0;
}

static int set_str(char **dst, size_t *dlen, const char *s) {
  size_t n = strlen(s);
  *dst = malloc(n + 1);
  if (!*dst) return ANNA_ENOMEM;
  memcpy(*dst, s, n + 1);
  *dlen = n;
  return 0;
}

static int gpt2_pipeline(tokenizer *t, const char *pre, char *err, size_t errlen) {
  if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2"))
    return add_bytelevel(t, 1, err, errlen);
  if (!strcmp(pre, "qwen2") || !strcmp(pre, "qwen35")) {
    /* The HF files of Qwen put NFC in front of the split. */
    if (!tok_pipe_push(&t->norm, TOK_NORM_NFC))
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    int rc = !strcmp(pre, "qwen2") ? add_split(t, re_qwen2, sizeof re_qwen2 - 1, err, errlen)
                                   : add_split(t, re_qwen35, sizeof re_qwen35 - 1, err, errlen);
    return rc ? rc : add_bytelevel(t, 0, err, errlen);
  }
  if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
    t->ignore_merges = 1;
    int rc = add_split(t, re_llama3, sizeof re_llama3 - 1, err, errlen);
    return rc ? rc : add_bytelevel(t, 0, err, errlen);
  }
  if (!strcmp(pre, "smollm")) {
    tok_step *st = tok_pipe_push(&t->pre, TOK_PRE_DIGITS);
    if (!st) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    st->individual_digits = 1;
    return add_bytelevel(t, 1, err, errlen);
  }
  return anna_err(err, errlen, ANNA_EUNSUPPORTED, "tokenizer pre-type \"%s\" is not supported",
                  pre);
}

static int spm_pipeline(tokenizer *t, int add_space_prefix, char *err, size_t errlen) {
  /* llama.cpp's SPM path: a space before every text segment (also after specials), spaces
   * written as U+2581, the whole segment merged as one word. */
  tok_step *st;
  if (add_space_prefix) {
    if (!(st = tok_pipe_push(&t->norm, TOK_NORM_PREPEND)) ||
        set_str(&st->repl, &st->repl_len, "\xe2\x96\x81"))
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  if (!(st = tok_pipe_push(&t->norm, TOK_NORM_REPLACE)) || set_str(&st->lit, &st->lit_len, " ") ||
      set_str(&st->repl, &st->repl_len, "\xe2\x96\x81"))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!(st = tok_pipe_push(&t->dec, TOK_DEC_REPLACE)) ||
      set_str(&st->lit, &st->lit_len, "\xe2\x96\x81") || set_str(&st->repl, &st->repl_len, " "))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!tok_pipe_push(&t->dec, TOK_DEC_BYTEFALLBACK))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (add_space_prefix) {
    if (!(st = tok_pipe_push(&t->dec, TOK_DEC_STRIP)) || set_str(&st->repl, &st->repl_len, " "))
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    st->strip_left = 1;
  }
  return 0;
}

int tokenizer_create_from_vocab(tokenizer **out, const tokenizer_vocab_desc *d, char *err,
                                size_t errlen) {
  *out = NULL;
  if (!d || !d->model || !d->tokens)
    return anna_err(err, errlen, ANNA_EINVAL, "vocab: model and tokens are required");
  int spm = !strcmp(d->model, "llama");
  if (!spm && strcmp(d->model, "gpt2"))
    return anna_err(err, errlen, ANNA_EUNSUPPORTED,
                    "tokenizer model \"%s\" is not supported "
                    "(gpt2, llama)",
                    d->model);
  if (d->n_tokens == 0 || d->n_tokens > TOK_MAX_ID)
    return anna_err(err, errlen, ANNA_EFORMAT, "vocab: %zu tokens is out of range", d->n_tokens);
  if (spm && !d->scores)
    return anna_err(err, errlen, ANNA_EFORMAT, "vocab: llama model needs scores");
  if (d->n_merges && (!d->merges))
    return anna_err(err, errlen, ANNA_EFORMAT, "vocab: merges missing");
  tokenizer *t;
  int32_t nv = (int32_t)d->n_tokens;
  int rc = tok_alloc(&t, nv, err, errlen);
  if (rc) return rc;
  t->kind = spm ? TOK_MODEL_SPM : TOK_MODEL_BPE;
  for (int32_t i = 0; i < nv; i++) {
    const char *s = d->tokens[i];
    size_t n = d->token_lens ? d->token_lens[i] : (s ? strlen(s) : 0);
    if (!s) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "vocab: token %ld is NULL", (long)i);
      goto fail;
    }
    if ((rc = tok_set_piece(t, i, s, n, err, errlen))) goto fail;
    int type = d->token_types ? d->token_types[i] : TOKENIZER_TOKEN_NORMAL;
    if (type == TOKENIZER_TOKEN_CONTROL)
      t->flags[i] = TOK_FLAG_ADDED | TOK_FLAG_SPECIAL;
    else if (type == TOKENIZER_TOKEN_USER_DEFINED)
      t->flags[i] = TOK_FLAG_ADDED;
  }
  if (spm) {
    t->scores = malloc((size_t)nv * sizeof *t->scores);
    if (!t->scores) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto fail;
    }
    memcpy(t->scores, d->scores, (size_t)nv * sizeof *t->scores);
    t->byte_fallback = 1;
  }
  /* Specials must be known before tok_finish builds the eog list. */
  int32_t *ids[] = {&t->bos_id, &t->eos_id, &t->pad_id, &t->unk_id, &t->eot_id};
  int32_t vals[] = {d->bos_id, d->eos_id, d->pad_id, d->unk_id, d->eot_id};
  for (int k = 0; k < 5; k++)
    *ids[k] = vals[k] >= 0 && vals[k] < nv ? vals[k] : -1;
  if ((rc = tok_finish(t, err, errlen))) goto fail;

  for (size_t i = 0; i < d->n_merges; i++) {
    const char *m = d->merges[i];
    size_t n = d->merge_lens ? d->merge_lens[i] : (m ? strlen(m) : 0);
    const char *sp = m ? memchr(m, ' ', n) : NULL;
    if (!sp || sp == m || sp + 1 == m + n) {
      rc = anna_err(err, errlen, ANNA_EFORMAT, "vocab: merge %zu is not \"a b\"", i);
      goto fail;
    }
    size_t al = (size_t)(sp - m);
    int32_t a = tok_map_find(t, &t->map, m, al);
    int32_t b = tok_map_find(t, &t->map, sp + 1, n - al - 1);
    char *cat = malloc(n);
    if (!cat) {
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
      goto fail;
    }
    memcpy(cat, m, al);
    memcpy(cat + al, sp + 1, n - al - 1);
    int32_t r = tok_map_find(t, &t->map, cat, n - 1);
    free(cat);
    if (a < 0 || b < 0 || r < 0) {
      rc = anna_err(err, errlen, ANNA_EFORMAT,
                    "vocab: merge %zu (\"%.*s\") uses a token not in "
                    "the vocabulary",
                    i, (int)(n > 60 ? 60 : n), m);
      goto fail;
    }
    if ((rc = tok_merge_add(t, a, b, r, (int32_t)i, err, errlen))) goto fail;
  }
  rc = spm ? spm_pipeline(t, d->add_space_prefix != 0, err, errlen)
           : gpt2_pipeline(t, d->pre, err, errlen);
  if (rc) goto fail;
  int add_bos = d->add_bos >= 0 ? d->add_bos : spm;
  int add_eos = d->add_eos >= 0 ? d->add_eos : 0;
  if (add_bos && t->bos_id >= 0) {
    if (!(t->post_pre = malloc(sizeof(int32_t)))) goto nomem;
    t->post_pre[0] = t->bos_id;
    t->n_post_pre = 1;
  }
  if (add_eos && t->eos_id >= 0) {
    if (!(t->post_post = malloc(sizeof(int32_t)))) goto nomem;
    t->post_post[0] = t->eos_id;
    t->n_post_post = 1;
  }
  *out = t;
  return 0;
nomem:
  rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
fail:
  tokenizer_free(t);
  return rc;
}
