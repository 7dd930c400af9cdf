/* tok_core.c: the tokenizer object (piece store, lookup maps, added-token matcher), the BPE
 * merge loop for both merge orders (ranks / SentencePiece scores), encode, decode and the
 * streaming decoder. Per-call scratch lives on the caller's stack frame, never in the
 * tokenizer, so one tokenizer serves concurrent encodes. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/error.h"
#include "tokenizer/tok_internal.h"

/* ---------------------------------------------------------------- construction */

int tok_alloc(tokenizer **out, int32_t n_vocab, char *err, size_t errlen) {
  *out = NULL;
  if (n_vocab <= 0 || n_vocab > TOK_MAX_ID)
    return anna_err(err, errlen, ANNA_EFORMAT, "vocabulary size %ld out of range", (long)n_vocab);
  tokenizer *t = calloc(1, sizeof *t);
  if (!t) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  t->n_vocab = n_vocab;
  t->off = calloc((size_t)n_vocab, sizeof *t->off);
  t->len = malloc((size_t)n_vocab * sizeof *t->len);
  t->flags = calloc((size_t)n_vocab, 1);
  if (!t->off || !t->len || !t->flags) {
    tokenizer_free(t);
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  for (int32_t i = 0; i < n_vocab; i++)
    t->len[i] = UINT32_MAX;
  t->unk_id = t->bos_id = t->eos_id = t->pad_id = t->eot_id = -1;
  for (int i = 0; i < 256; i++)
    t->byte_ids[i] = -1;
  tok_bytelevel_init(t);
  *out = t;
  return 0;
}

int tok_set_piece(tokenizer *t, int32_t id, const char *s, size_t n, char *err, size_t errlen) {
  if (id < 0 || id >= t->n_vocab)
    return anna_err(err, errlen, ANNA_ERANGE, "token id %ld out of range", (long)id);
  if (n >= UINT32_MAX / 2)
    return anna_err(err, errlen, ANNA_EFORMAT, "token %ld is too long", (long)id);
  if (t->arena_len + n + 1 > t->arena_cap) {
    size_t nc = t->arena_cap ? t->arena_cap : 1 << 16;
    while (nc < t->arena_len + n + 1)
      nc *= 2;
    char *na = realloc(t->arena, nc);
    if (!na) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    t->arena = na;
    t->arena_cap = nc;
  }
  memcpy(t->arena + t->arena_len, s, n);
  t->arena[t->arena_len + n] = 0;
  t->off[id] = t->arena_len;
  t->len[id] = (uint32_t)n;
  t->arena_len += n + 1;
  return 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

int32_t tok_map_find(const tokenizer *t, const tok_strmap *m, const char *s, size_t n) {
  if (!m->cap) return -1;
  size_t mask = m->cap - 1;
  for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
    int32_t id = m->slots[i];
    if (id < 0) return -1;
    if (t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
  }
}

/* Inserts id unless its piece is already mapped (the first id of a duplicate wins). */
static void map_insert(const tokenizer *t, tok_strmap *m, int32_t id) {
  size_t mask = m->cap - 1;
  const char *s = t->arena + t->off[id];
  size_t n = t->len[id];
  for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
    int32_t o = m->slots[i];
    if (o < 0) {
      m->slots[i] = id;
      return;
    }
    if (t->len[o] == n && memcmp(t->arena + t->off[o], s, n) == 0) return;
  }
}

static int map_build(const tokenizer *t, tok_strmap *m, size_t count) {
  size_t cap = 16;
  while (cap < count * 2 + 1)
    cap *= 2;
  m->slots = malloc(cap * sizeof *m->slots);
  if (!m->slots) return ANNA_ENOMEM;
  m->cap = cap;
  for (size_t i = 0; i < cap; i++)
    m->slots[i] = -1;
  return 0;
}

static int merges_grow(tok_mergemap *mm) {
  size_t nc = mm->cap ? mm->cap * 2 : 1024;
  uint64_t *k = calloc(nc, sizeof *k);
  int32_t *r = malloc(nc * sizeof *r), *res = malloc(nc * sizeof *res);
  if (!k || !r || !res) {
    free(k);
    free(r);
    free(res);
    return ANNA_ENOMEM;
  }
  for (size_t i = 0; i < mm->cap; i++) {
    if (!mm->keys[i]) continue;
    size_t j = hash_u64(mm->keys[i]) & (nc - 1);
    while (k[j])
      j = (j + 1) & (nc - 1);
    k[j] = mm->keys[i];
    r[j] = mm->rank[i];
    res[j] = mm->result[i];
  }
  free(mm->keys);
  free(mm->rank);
  free(mm->result);
  mm->keys = k;
  mm->rank = r;
  mm->result = res;
  mm->cap = nc;
  return 0;
}

int tok_merge_add(tokenizer *t, int32_t left, int32_t right, int32_t result, int32_t rank,
                  char *err, size_t errlen) {
  tok_mergemap *mm = &t->merges;
  if ((mm->count + 1) * 2 > mm->cap && merges_grow(mm))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
  size_t j = hash_u64(key) & (mm->cap - 1);
  while (mm->keys[j]) {
    if (mm->keys[j] == key) return 0; /* a repeated merge keeps its first (best) rank */
    j = (j + 1) & (mm->cap - 1);
  }
  mm->keys[j] = key;
  mm->rank[j] = rank;
  mm->result[j] = result;
  mm->count++;
  return 0;
}

static int merge_find(const tok_mergemap *mm, int32_t left, int32_t right, int32_t *rank,
                      int32_t *result) {
  if (!mm->cap) return 0;
  uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
  for (size_t j = hash_u64(key) & (mm->cap - 1); mm->keys[j]; j = (j + 1) & (mm->cap - 1)) {
    if (mm->keys[j] == key) {
      *rank = mm->rank[j];
      *result = mm->result[j];
      return 1;
    }
  }
  return 0;
}

void tok_eog_add(tokenizer *t, int32_t id) {
  if (id < 0 || id >= t->n_vocab) return;
  for (size_t i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) return;
  int32_t *ne = realloc(t->eog, (t->n_eog + 1) * sizeof *ne);
  if (!ne) return; /* the list is advisory; the eos id itself is still kept in eos_id */
  t->eog = ne;
  t->eog[t->n_eog++] = id;
}

static int cmp_u32_desc(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

int tok_finish(tokenizer *t, char *err, size_t errlen) {
  size_t count = 0;
  for (int32_t i = 0; i < t->n_vocab; i++)
    count += t->len[i] != UINT32_MAX;
  if (map_build(t, &t->map, count)) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  for (int32_t i = 0; i < t->n_vocab; i++) {
    if (t->len[i] == UINT32_MAX) continue;
    /* Added tokens win the piece -> id lookup over a vocab entry with the same text. */
    if (t->flags[i] & TOK_FLAG_ADDED) map_insert(t, &t->map, i);
  }
  for (int32_t i = 0; i < t->n_vocab; i++) {
    if (t->len[i] == UINT32_MAX) continue;
    if (!(t->flags[i] & TOK_FLAG_ADDED)) map_insert(t, &t->map, i);
    const char *s = t->arena + t->off[i];
    if (t->len[i] == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
      unsigned v = 0;
      int ok = 1;
      for (int k = 3; k < 5; k++) {
        char c = s[k];
        v = v * 16 + (unsigned)(c >= '0' && c <= '9'   ? c - '0'
                                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                       : (ok = 0));
      }
      if (ok && t->byte_ids[v] < 0) t->byte_ids[v] = i;
    }
  }

  size_t na = 0;
  for (int32_t i = 0; i < t->n_vocab; i++)
    na += (t->flags[i] & TOK_FLAG_ADDED) && t->len[i] != UINT32_MAX && t->len[i] > 0;
  if (na) {
    t->added = calloc(na, sizeof *t->added);
    if (!t->added || map_build(t, &t->added_map, na))
      return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    size_t counts[256] = {0};
    for (int32_t i = 0; i < t->n_vocab; i++) {
      if (!(t->flags[i] & TOK_FLAG_ADDED) || t->len[i] == UINT32_MAX || t->len[i] == 0) continue;
      tokenizer_added_token *a = &t->added[t->n_added++];
      a->id = i;
      a->content = t->arena + t->off[i];
      a->len = t->len[i];
      a->special = (t->flags[i] & TOK_FLAG_SPECIAL) != 0;
      map_insert(t, &t->added_map, i);
      counts[(unsigned char)a->content[0]]++;
    }
    for (int b = 0; b < 256; b++) {
      if (!counts[b]) continue;
      t->len_lists[b] = malloc(counts[b] * sizeof(uint32_t));
      if (!t->len_lists[b]) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < t->n_added; k++) {
      unsigned char b = (unsigned char)t->added[k].content[0];
      uint32_t l = (uint32_t)t->added[k].len;
      size_t j;
      for (j = 0; j < t->n_len_lists[b]; j++)
        if (t->len_lists[b][j] == l) break;
      if (j == t->n_len_lists[b]) t->len_lists[b][t->n_len_lists[b]++] = l;
    }
    for (int b = 0; b < 256; b++)
      if (t->n_len_lists[b] > 1)
        qsort(t->len_lists[b], t->n_len_lists[b], sizeof(uint32_t), cmp_u32_desc);
  }

  /* Turn-ending specials that chat templates close a reply with. */
  static const char *const eog_names[] = {
      "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>",   "<end_of_turn>",
      "<|end|>",    "<|return|>", "</s>",       "<|end_of_text|>", "<turn|>",
  };
  tok_eog_add(t, t->eos_id);
  tok_eog_add(t, t->eot_id);
  for (size_t k = 0; k < sizeof eog_names / sizeof eog_names[0]; k++) {
    int32_t id = tok_map_find(t, &t->added_map, eog_names[k], strlen(eog_names[k]));
    if (id >= 0 && (t->flags[id] & TOK_FLAG_SPECIAL)) tok_eog_add(t, id);
  }
  return 0;
}

void tokenizer_free(tokenizer *t) {
  if (!t) return;
  free(t->arena);
  free(t->off);
  free(t->len);
  free(t->flags);
  free(t->scores);
  free(t->map.slots);
  free(t->merges.keys);
  free(t->merges.rank);
  free(t->merges.result);
  free(t->post_pre);
  free(t->post_post);
  tok_pipe_free(&t->norm);
  tok_pipe_free(&t->pre);
  tok_pipe_free(&t->dec);
  free(t->added);
  free(t->added_map.slots);
  for (int b = 0; b < 256; b++)
    free(t->len_lists[b]);
  free(t->eog);
  free(t);
}

/* ---------------------------------------------------------------- BPE */

typedef struct sym {
  uint32_t off, len; /* bytes of the word; len 0 = merged away */
  int32_t id;        /* -1: no vocabulary entry (yet) */
  int32_t prev, next;
} sym;

typedef struct cand {
  double key; /* lower merges first: rank, or -score */
  int32_t l, r, result;
  uint32_t size;
} cand;

/* Per-encode scratch, reused across the words of one call. */
typedef struct scratch {
  sym *syms;
  size_t nsym, capsym;
  cand *heap;
  size_t nheap, capheap;
  int32_t *ids;
  size_t nids, capids;
  tok_buf norm;
  tok_pieces pieces, tmp;
  pcre2_match_data *md;
} scratch;

static int ids_push(scratch *sc, int32_t id) {
  if (sc->nids == sc->capids) {
    size_t nc = sc->capids ? sc->capids * 2 : 256;
    int32_t *ni = realloc(sc->ids, nc * sizeof *ni);
    if (!ni) return ANNA_ENOMEM;
    sc->ids = ni;
    sc->capids = nc;
  }
  sc->ids[sc->nids++] = id;
  return 0;
}

static int sym_push(scratch *sc, uint32_t off, uint32_t len, int32_t id) {
  if (sc->nsym == sc->capsym) {
    size_t nc = sc->capsym ? sc->capsym * 2 : 256;
    sym *ns = realloc(sc->syms, nc * sizeof *ns);
    if (!ns) return ANNA_ENOMEM;
    sc->syms = ns;
    sc->capsym = nc;
  }
  int32_t i = (int32_t)sc->nsym++;
  sc->syms[i] = (sym){off, len, id, i - 1, -1};
  if (i > 0) sc->syms[i - 1].next = i;
  return 0;
}

static int cand_less(const cand *a, const cand *b) {
  if (a->key != b->key) return a->key < b->key;
  return a->l < b->l;
}

static int heap_push(scratch *sc, cand c) {
  if (sc->nheap == sc->capheap) {
    size_t nc = sc->capheap ? sc->capheap * 2 : 256;
    cand *nh = realloc(sc->heap, nc * sizeof *nh);
    if (!nh) return ANNA_ENOMEM;
    sc->heap = nh;
    sc->capheap = nc;
  }
  size_t i = sc->nheap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &sc->heap[p])) break;
    sc->heap[i] = sc->heap[p];
    i = p;
  }
  sc->heap[i] = c;
  return 0;
}

static cand heap_pop(scratch *sc) {
  cand top = sc->heap[0], last = sc->heap[--sc->nheap];
  size_t i = 0, n = sc->nheap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && cand_less(&sc->heap[c + 1], &sc->heap[c])) c++;
    if (!cand_less(&sc->heap[c], &last)) break;
    sc->heap[i] = sc->heap[c];
    i = c;
  }
  if (n) sc->heap[i] = last;
  return top;
}

static int try_pair(const tokenizer *t, scratch *sc, const char *w, int32_t l, int32_t r) {
  if (l < 0 || r < 0) return 0;
  const sym *a = &sc->syms[l], *b = &sc->syms[r];
  cand c = {0, l, r, -1, a->len + b->len};
  if (t->kind == TOK_MODEL_BPE) {
    int32_t rank;
    if (a->id < 0 || b->id < 0 || !merge_find(&t->merges, a->id, b->id, &rank, &c.result)) return 0;
    c.key = rank;
  } else {
    int32_t id = tok_map_find(t, &t->map, w + a->off, c.size);
    if (id < 0 || (t->flags[id] & TOK_FLAG_ADDED)) return 0;
    c.result = id;
    c.key = t->scores ? -(double)t->scores[id] : 0.0;
  }
  return heap_push(sc, c);
}

static size_t utf8_clen(const char *s, size_t n) {
  unsigned char c = (unsigned char)s[0];
  size_t k = c < 0x80             ? 1
             : (c & 0xe0) == 0xc0 ? 2
             : (c & 0xf0) == 0xe0 ? 3
             : (c & 0xf8) == 0xf0 ? 4
                                  : 1;
  return k > n ? n : k;
}

/* Emits byte-fallback ids for bytes s[0..n), or unk, or nothing. */
static int emit_unknown(const tokenizer *t, scratch *sc, const char *s, size_t n, int *last_unk) {
  if (t->byte_fallback) {
    int all = 1;
    for (size_t i = 0; i < n; i++)
      all &= t->byte_ids[(unsigned char)s[i]] >= 0;
    if (all) {
      for (size_t i = 0; i < n; i++)
        if (ids_push(sc, t->byte_ids[(unsigned char)s[i]])) return ANNA_ENOMEM;
      *last_unk = 0;
      return 0;
    }
  }
  if (t->unk_id < 0) return 0; /* HF drops what it cannot represent when there is no unk */
  if (t->fuse_unk && *last_unk) return 0;
  *last_unk = 1;
  return ids_push(sc, t->unk_id);
}

/* Encodes one pre-token. */
static int bpe_word(const tokenizer *t, scratch *sc, const char *w, size_t n) {
  if (n == 0) return 0;
  if (n >= UINT32_MAX / 2) return ANNA_EINVAL;
  if (t->ignore_merges) {
    int32_t id = tok_map_find(t, &t->map, w, n);
    if (id >= 0) return ids_push(sc, id);
  }
  sc->nsym = 0;
  sc->nheap = 0;
  int last_unk = 0;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_clen(w + i, n - i);
    int32_t id = tok_map_find(t, &t->map, w + i, k);
    if (id >= 0 && (t->flags[id] & TOK_FLAG_ADDED) && t->kind == TOK_MODEL_SPM) id = -1;
    if (id >= 0 || t->kind == TOK_MODEL_SPM) {
      if (sym_push(sc, (uint32_t)i, (uint32_t)k, id)) return ANNA_ENOMEM;
      last_unk = 0;
    } else {
      /* HF BPE: an unknown char becomes byte-fallback symbols (which may still merge),
       * else one unk symbol, fused with a preceding unk when fuse_unk is set. */
      int all = t->byte_fallback;
      for (size_t j = 0; j < k && all; j++)
        all = t->byte_ids[(unsigned char)w[i + j]] >= 0;
      if (all) {
        for (size_t j = 0; j < k; j++)
          if (sym_push(sc, (uint32_t)(i + j), 1, t->byte_ids[(unsigned char)w[i + j]]))
            return ANNA_ENOMEM;
        last_unk = 0;
      } else if (t->unk_id >= 0) {
        if (t->fuse_unk && last_unk)
          sc->syms[sc->nsym - 1].len += (uint32_t)k;
        else if (sym_push(sc, (uint32_t)i, (uint32_t)k, t->unk_id))
          return ANNA_ENOMEM;
        last_unk = 1;
      }
    }
    i += k;
  }
  for (int32_t i = 0; i + 1 < (int32_t)sc->nsym; i++)
    if (try_pair(t, sc, w, i, i + 1)) return ANNA_ENOMEM;
  while (sc->nheap) {
    cand c = heap_pop(sc);
    sym *a = &sc->syms[c.l], *b = &sc->syms[c.r];
    if (a->len == 0 || b->len == 0 || a->next != c.r || a->len + b->len != c.size) continue;
    a->len += b->len;
    a->id = c.result;
    a->next = b->next;
    b->len = 0;
    if (a->next >= 0) sc->syms[a->next].prev = c.l;
    if (try_pair(t, sc, w, a->prev, c.l) || try_pair(t, sc, w, c.l, a->next)) return ANNA_ENOMEM;
  }
  last_unk = 0;
  for (int32_t i = sc->nsym ? 0 : -1; i >= 0; i = sc->syms[i].next) {
    const sym *s = &sc->syms[i];
    if (s->id >= 0) {
      if (ids_push(sc, s->id)) return ANNA_ENOMEM;
      last_unk = 0;
    } else if (emit_unknown(t, sc, w + s->off, s->len, &last_unk)) {
      return ANNA_ENOMEM;
    }
  }
  return 0;
}

static int encode_segment(const tokenizer *t, scratch *sc, const char *s, size_t n, int seg_first,
                          char *err, size_t errlen) {
  if (n == 0) return 0;
  int rc = tok_normalize(t, s, n, &sc->norm, sc->md, err, errlen);
  if (rc) return rc;
  rc = tok_pretokenize(t, sc->norm.p, sc->norm.n, seg_first, &sc->pieces, &sc->tmp, sc->md, err,
                       errlen);
  if (rc) return rc;
  for (size_t i = 0; i < sc->pieces.n; i++) {
    rc = bpe_word(t, sc, sc->pieces.buf.p + sc->pieces.off[i], sc->pieces.len[i]);
    if (rc) return anna_err(err, errlen, rc, "out of memory");
  }
  return 0;
}

/* Length of the whitespace run ending at s[end) (going back no further than start). */
static size_t ws_before(const char *s, size_t start, size_t end) {
  size_t e = end;
  while (e > start) {
    size_t k = 1;
    while (k < e - start && k < 4 && ((unsigned char)s[e - k] & 0xc0) == 0x80)
      k++;
    utf8proc_int32_t c;
    if (utf8proc_iterate((const utf8proc_uint8_t *)s + e - k, (utf8proc_ssize_t)k, &c) !=
            (utf8proc_ssize_t)k ||
        !tok_is_ws(c))
      break;
    e -= k;
  }
  return end - e;
}

static size_t ws_after(const char *s, size_t start, size_t n) {
  size_t i = start;
  while (i < n) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0 || !tok_is_ws(c)) break;
    i += (size_t)k;
  }
  return i - start;
}

static int is_word_char(const char *s, size_t n) {
  utf8proc_int32_t c;
  if (utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c) <= 0) return 0;
  utf8proc_category_t k = utf8proc_category(c);
  return c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) ||
         (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
}

/* Longest added token starting at text[p], or -1. */
static int32_t added_match(const tokenizer *t, const char *text, size_t len, size_t p, int flags,
                           size_t *mlen) {
  unsigned char b = (unsigned char)text[p];
  for (size_t j = 0; j < t->n_len_lists[b]; j++) {
    size_t l = t->len_lists[b][j];
    if (l > len - p) continue;
    int32_t id = tok_map_find(t, &t->added_map, text + p, l);
    if (id < 0) continue;
    if ((flags & TOKENIZER_ENCODE_NO_PARSE_SPECIAL) && (t->flags[id] & TOK_FLAG_SPECIAL)) continue;
    if (t->flags[id] & TOK_FLAG_SINGLE_WORD) {
      size_t q = p;
      while (q > 0 && ((unsigned char)text[q - 1] & 0xc0) == 0x80)
        q--;
      if (p > 0 && q > 0) {
        size_t s0 = q - 1;
        while (s0 > 0 && ((unsigned char)text[s0] & 0xc0) == 0x80)
          s0--;
        if (is_word_char(text + s0, p - s0)) continue;
      }
      if (p + l < len && is_word_char(text + p + l, len - p - l)) continue;
    }
    *mlen = l;
    return id;
  }
  return -1;
}

static int utf8_valid(const char *s, size_t n, size_t *bad) {
  for (size_t i = 0; i < n;) {
    if ((unsigned char)s[i] < 0x80) {
      i++;
      continue;
    }
    utf8proc_int32_t c;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
      *bad = i;
      return 0;
    }
    i += (size_t)k;
  }
  return 1;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                     size_t *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  if (!t || (!text && len))
    return anna_err(err, errlen, ANNA_EINVAL, "tokenizer_encode: NULL argument");
  size_t bad = 0;
  if (!utf8_valid(text, len, &bad))
    return anna_err(err, errlen, ANNA_EINVAL, "text is not valid UTF-8 (byte %zu)", bad);
  scratch sc = {0};
  int rc = 0;
  sc.md = pcre2_match_data_create(32, NULL);
  if (!sc.md) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (!rc && (flags & TOKENIZER_ENCODE_ADD_SPECIAL))
    for (size_t i = 0; i < t->n_post_pre && !rc; i++)
      if (ids_push(&sc, t->post_pre[i])) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  size_t seg = 0;
  for (size_t p = 0; p < len && !rc;) {
    size_t ml = 0;
    int32_t id =
        t->n_len_lists[(unsigned char)text[p]] ? added_match(t, text, len, p, flags, &ml) : -1;
    if (id < 0) {
      p++;
      continue;
    }
    size_t seg_end = p;
    if (t->flags[id] & TOK_FLAG_LSTRIP) seg_end -= ws_before(text, seg, p);
    rc = encode_segment(t, &sc, text + seg, seg_end - seg, seg == 0, err, errlen);
    if (!rc && ids_push(&sc, id)) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    p += ml;
    if (t->flags[id] & TOK_FLAG_RSTRIP) p += ws_after(text, p, len);
    seg = p;
  }
  if (!rc) rc = encode_segment(t, &sc, text + seg, len - seg, seg == 0, err, errlen);
  if (!rc && (flags & TOKENIZER_ENCODE_ADD_SPECIAL))
    for (size_t i = 0; i < t->n_post_post && !rc; i++)
      if (ids_push(&sc, t->post_post[i])) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  pcre2_match_data_free(sc.md);
  free(sc.syms);
  free(sc.heap);
  free(sc.norm.p);
  tok_pieces_free(&sc.pieces);
  tok_pieces_free(&sc.tmp);
  if (rc) {
    free(sc.ids);
    return rc;
  }
  *ids = sc.ids;
  *n = sc.nids;
  return 0;
}

/* ---------------------------------------------------------------- decode */

/* Copies the complete UTF-8 prefix of s to out (invalid bytes -> U+FFFD) and returns how
 * many bytes were consumed; an incomplete but so-far valid last character is left over
 * unless final is set. */
static size_t utf8_sanitize(const char *s, size_t n, int final, tok_buf *out, int *oom) {
  static const char repl[3] = {(char)0xef, (char)0xbf, (char)0xbd};
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) {
      if (tok_buf_put(out, s + i, 1)) *oom = 1;
      i++;
      continue;
    }
    size_t need = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (need && i + need > n && !final) {
      int cont = 1;
      for (size_t j = i + 1; j < n; j++)
        cont &= ((unsigned char)s[j] & 0xc0) == 0x80;
      if (cont) break;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = need && i + need <= n ? utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                                                  (utf8proc_ssize_t)need, &cp)
                                               : -1;
    if (k == (utf8proc_ssize_t)need) {
      if (tok_buf_put(out, s + i, need)) *oom = 1;
      i += need;
    } else {
      /* Like from_utf8_lossy: a lead byte and the continuation bytes that follow it (a
       * truncated character) become one U+FFFD. */
      size_t j = i + 1;
      if (need && c >= 0xc2 && c <= 0xf4)
        while (j < n && j < i + need && ((unsigned char)s[j] & 0xc0) == 0x80)
          j++;
      if (tok_buf_put(out, repl, 3)) *oom = 1;
      i = j;
    }
  }
  return i;
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, int flags, char **text,
                     size_t *len, char *err, size_t errlen) {
  *text = NULL;
  *len = 0;
  tok_buf raw = {0}, s1 = {0}, s2 = {0}, out = {0};
  int first = 1, rc = tok_buf_put(&raw, "", 0);
  for (size_t i = 0; i < n && !rc; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->n_vocab || t->len[id] == UINT32_MAX) {
      rc = anna_err(err, errlen, ANNA_ERANGE, "token id %ld out of range (vocab %ld)", (long)id,
                    (long)t->n_vocab);
      break;
    }
    if ((flags & TOKENIZER_DECODE_SKIP_SPECIAL) && (t->flags[id] & TOK_FLAG_SPECIAL)) continue;
    if (tok_decode_piece(t, id, first, &raw, &s1, &s2))
      rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
    first = 0;
  }
  int oom = 0;
  if (!rc) {
    oom = tok_buf_put(&out, "", 0) != 0;
    utf8_sanitize(raw.p, raw.n, 1, &out, &oom);
    if (oom) rc = anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  }
  free(raw.p);
  free(s1.p);
  free(s2.p);
  if (rc) {
    free(out.p);
    return rc;
  }
  *text = out.p;
  *len = out.n;
  return 0;
}

struct tokenizer_stream {
  const tokenizer *t;
  int flags, first;
  tok_buf pend, s1, s2, out;
};

int tokenizer_stream_new(tokenizer_stream **out, const tokenizer *t, int flags, char *err,
                         size_t errlen) {
  *out = calloc(1, sizeof **out);
  if (!*out) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  (*out)->t = t;
  (*out)->flags = flags;
  (*out)->first = 1;
  return 0;
}

void tokenizer_stream_free(tokenizer_stream *s) {
  if (!s) return;
  free(s->pend.p);
  free(s->s1.p);
  free(s->s2.p);
  free(s->out.p);
  free(s);
}

static int stream_emit(tokenizer_stream *s, int final, char *out, size_t cap, size_t *out_len,
                       char *err, size_t errlen) {
  int oom = 0;
  s->out.n = 0;
  size_t used = utf8_sanitize(s->pend.p, s->pend.n, final, &s->out, &oom);
  if (oom) return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  if (s->out.n > cap) {
    /* Keep everything pending so a retry with a larger buffer loses nothing. */
    return anna_err(err, errlen, ANNA_ERANGE, "stream output needs %zu bytes, buffer has %zu",
                    s->out.n, cap);
  }
  if (s->out.n) memcpy(out, s->out.p, s->out.n);
  *out_len = s->out.n;
  if (used) {
    memmove(s->pend.p, s->pend.p + used, s->pend.n - used);
    s->pend.n -= used;
  }
  return 0;
}

int tokenizer_stream_feed(tokenizer_stream *s, int32_t id, char *out, size_t cap, size_t *out_len,
                          char *err, size_t errlen) {
  const tokenizer *t = s->t;
  *out_len = 0;
  if (id < 0 || id >= t->n_vocab || t->len[id] == UINT32_MAX)
    return anna_err(err, errlen, ANNA_ERANGE, "token id %ld out of range (vocab %ld)", (long)id,
                    (long)t->n_vocab);
  if ((s->flags & TOKENIZER_DECODE_SKIP_SPECIAL) && (t->flags[id] & TOK_FLAG_SPECIAL)) return 0;
  if (tok_decode_piece(t, id, s->first, &s->pend, &s->s1, &s->s2))
    return anna_err(err, errlen, ANNA_ENOMEM, "out of memory");
  s->first = 0;
  return stream_emit(s, 0, out, cap, out_len, err, errlen);
}

int tokenizer_stream_flush(tokenizer_stream *s, char *out, size_t cap, size_t *out_len, char *err,
                           size_t errlen) {
  int rc = stream_emit(s, 1, out, cap, out_len, err, errlen);
  if (!rc) s->first = 1;
  return rc;
}

/* ---------------------------------------------------------------- lookups */

int32_t tokenizer_n_vocab(const tokenizer *t) {
  return t->n_vocab;
}

int32_t tokenizer_token_id_n(const tokenizer *t, const char *piece, size_t len) {
  return tok_map_find(t, &t->map, piece, len);
}

int32_t tokenizer_token_id(const tokenizer *t, const char *piece) {
  return piece ? tok_map_find(t, &t->map, piece, strlen(piece)) : -1;
}

const char *tokenizer_token_str(const tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->n_vocab || t->len[id] == UINT32_MAX) return NULL;
  if (len) *len = t->len[id];
  return t->arena + t->off[id];
}

int tokenizer_token_is_special(const tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_FLAG_SPECIAL) != 0;
}

int32_t tokenizer_bos_id(const tokenizer *t) {
  return t->bos_id;
}
int32_t tokenizer_eos_id(const tokenizer *t) {
  return t->eos_id;
}
int32_t tokenizer_pad_id(const tokenizer *t) {
  return t->pad_id;
}
int32_t tokenizer_unk_id(const tokenizer *t) {
  return t->unk_id;
}

const int32_t *tokenizer_eog_ids(const tokenizer *t, size_t *n) {
  *n = t->n_eog;
  return t->eog;
}

int tokenizer_is_eog(const tokenizer *t, int32_t id) {
  for (size_t i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) return 1;
  return 0;
}

const tokenizer_added_token *tokenizer_added_tokens(const tokenizer *t, size_t *n) {
  *n = t->n_added;
  return t->added;
}

void tokenizer_vocab_desc_init(tokenizer_vocab_desc *d) {
  memset(d, 0, sizeof *d);
  d->bos_id = d->eos_id = d->pad_id = d->unk_id = d->eot_id = -1;
  d->add_bos = d->add_eos = d->add_space_prefix = -1;
}
