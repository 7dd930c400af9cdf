/* test_gguf: builds GGUF images byte by byte (valid and malformed) and checks that the
 * reader parses the valid ones exactly and rejects each malformed one with a clean error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "formats/dtype.h"
#include "formats/gguf.h"

static int g_fail;
#define CHECK(c)                                                         \
  do {                                                                   \
    if (!(c)) {                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      g_fail++;                                                          \
    }                                                                    \
  } while (0)

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}
static void u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void u32(buf *b, uint32_t v) { put(b, &v, 4); } /* test host is little-endian */
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void f32(buf *b, float v) { put(b, &v, 4); }
static void str(buf *b, const char *s) {
  u64(b, strlen(s));
  put(b, s, strlen(s));
}
static void pad_to(buf *b, size_t align) {
  while (b->n % align) u8(b, 0);
}

/* One file with every metadata type, then two tensors (F32 [4,2] and Q8_0 [32]). Knobs let
 * each malformed case change one thing. */
typedef struct opts {
  uint64_t n_tensors_claim; /* 0 = honest */
  uint32_t align;           /* general.alignment, 0 = omit */
  uint64_t t1_offset;       /* UINT64_MAX = honest */
  uint32_t t1_type;
  uint64_t t1_dim0;
} opts;

static buf build(const opts *o) {
  buf b = {0};
  u32(&b, 0x46554747u);
  u32(&b, 3);
  u64(&b, o->n_tensors_claim ? o->n_tensors_claim : 2);
  u64(&b, o->align ? 9 : 8);
  str(&b, "general.architecture"); u32(&b, GGUF_TYPE_STRING); str(&b, "llama");
  str(&b, "t.u8"); u32(&b, GGUF_TYPE_UINT8); u8(&b, 200);
  str(&b, "t.i32"); u32(&b, GGUF_TYPE_INT32); u32(&b, (uint32_t)-5);
  str(&b, "t.f32"); u32(&b, GGUF_TYPE_FLOAT32); f32(&b, 1.5f);
  str(&b, "t.bool"); u32(&b, GGUF_TYPE_BOOL); u8(&b, 1);
  str(&b, "t.u64"); u32(&b, GGUF_TYPE_UINT64); u64(&b, 1ull << 40);
  str(&b, "t.arr_i32"); u32(&b, GGUF_TYPE_ARRAY); u32(&b, GGUF_TYPE_INT32); u64(&b, 3);
  u32(&b, 7); u32(&b, (uint32_t)-8); u32(&b, 9);
  str(&b, "t.arr_str"); u32(&b, GGUF_TYPE_ARRAY); u32(&b, GGUF_TYPE_STRING); u64(&b, 3);
  str(&b, "a"); str(&b, ""); str(&b, "hello");
  if (o->align) {
    str(&b, "general.alignment"); u32(&b, GGUF_TYPE_UINT32); u32(&b, o->align);
  }
  size_t al = o->align ? o->align : 32;
  /* tensor 0: F32 [4, 2] at 0 (32 bytes); tensor 1: Q8_0 [32] at align_up(32). */
  str(&b, "w0"); u32(&b, 2); u64(&b, 4); u64(&b, 2); u32(&b, ANNA_DTYPE_F32); u64(&b, 0);
  str(&b, "w1"); u32(&b, 1); u64(&b, o->t1_dim0); u32(&b, o->t1_type);
  uint64_t off1 = (32 + al - 1) / al * al;
  u64(&b, o->t1_offset == UINT64_MAX ? off1 : o->t1_offset);
  pad_to(&b, al);
  for (int k = 0; k < 8; k++) f32(&b, (float)k);
  while (b.n % al) u8(&b, 0);
  u8(&b, 0x00); u8(&b, 0x3c); /* f16 1.0 */
  for (int k = 0; k < 32; k++) u8(&b, (uint8_t)(k - 16));
  return b;
}

static const opts k_honest = {0, 0, UINT64_MAX, ANNA_DTYPE_Q8_0, 32};
static opts honest(void) { return k_honest; }

static int try_open(const buf *b, char *err, size_t errlen) {
  gguf_file *f = NULL;
  int rc = gguf_open_buffer(&f, b->p, b->n, err, errlen);
  CHECK((rc == 0) == (f != NULL));
  gguf_close(f);
  return rc;
}

static void expect_error(const char *what, const buf *b) {
  char err[256] = "";
  int rc = try_open(b, err, sizeof err);
  CHECK(rc < 0);
  CHECK(err[0] != 0);
  printf("  %-28s -> %s\n", what, err);
}

static void test_valid(void) {
  opts o = honest();
  buf b = build(&o);
  char err[256];
  gguf_file *f = NULL;
  int rc = gguf_open_buffer(&f, b.p, b.n, err, sizeof err);
  if (rc) fprintf(stderr, "open: %s\n", err);
  CHECK(rc == 0);
  if (rc) return;
  CHECK(gguf_version(f) == 3);
  CHECK(gguf_kv_count(f) == 8);
  const char *s = NULL;
  CHECK(gguf_get_str(f, "general.architecture", &s, err, sizeof err) == 0 && !strcmp(s, "llama"));
  uint32_t u = 0;
  CHECK(gguf_get_u32(f, "t.u8", &u, err, sizeof err) == 0 && u == 200);
  CHECK(gguf_get_u32(f, "t.i32", &u, err, sizeof err) == ANNA_EFORMAT); /* negative */
  CHECK(gguf_get_u32(f, "t.u64", &u, err, sizeof err) == ANNA_EFORMAT); /* too big */
  int64_t i = 0;
  CHECK(gguf_get_i64(f, "t.i32", &i, err, sizeof err) == 0 && i == -5);
  CHECK(gguf_get_i64(f, "t.u64", &i, err, sizeof err) == 0 && i == (1ll << 40));
  float x = 0;
  CHECK(gguf_get_f32(f, "t.f32", &x, err, sizeof err) == 0 && x == 1.5f);
  bool bo = false;
  CHECK(gguf_get_bool(f, "t.bool", &bo, err, sizeof err) == 0 && bo);
  CHECK(gguf_get_bool(f, "t.f32", &bo, err, sizeof err) == ANNA_EFORMAT);
  CHECK(gguf_get_str(f, "missing", &s, err, sizeof err) == ANNA_ENOTFOUND);
  const gguf_array *a = NULL;
  CHECK(gguf_get_arr(f, "t.arr_i32", &a, err, sizeof err) == 0);
  if (a) {
    CHECK(a->count == 3 && a->elem_type == GGUF_TYPE_INT32);
    CHECK(gguf_array_get_i64(a, 1) == -8 && gguf_array_get_i64(a, 2) == 9);
    CHECK(gguf_array_get_i64(a, 3) == 0);
  }
  CHECK(gguf_get_arr(f, "t.arr_str", &a, err, sizeof err) == 0);
  if (a) {
    CHECK(a->count == 3 && a->elem_type == GGUF_TYPE_STRING);
    CHECK(!strcmp(a->strs[0], "a") && a->lens[1] == 0 && !strcmp(a->strs[2], "hello"));
  }
  CHECK(gguf_tensor_count(f) == 2);
  const gguf_tensor *t = gguf_tensor_find(f, "w0");
  CHECK(t && t->type == ANNA_DTYPE_F32 && t->ndim == 2 && t->dims[0] == 4 && t->dims[1] == 2);
  if (t) {
    CHECK(t->nbytes == 32 && ((const float *)t->data)[7] == 7.0f);
    CHECK((size_t)((const uint8_t *)t->data - b.p) % 32 == 0);
  }
  t = gguf_tensor_find(f, "w1");
  CHECK(t && t->type == ANNA_DTYPE_Q8_0 && t->nbytes == 34 && t->nelem == 32);
  if (t) CHECK(((const int8_t *)t->data)[2 + 31] == 15);
  CHECK(gguf_tensor_find(f, "nope") == NULL);
  gguf_close(f);

  /* Same file through the mmap path. */
  char path[] = "/tmp/anna_test_gguf_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    CHECK(write(fd, b.p, b.n) == (ssize_t)b.n);
    close(fd);
    CHECK(gguf_open(&f, path, err, sizeof err) == 0);
    if (f) CHECK(gguf_tensor_count(f) == 2);
    gguf_close(f);
    unlink(path);
  }
  CHECK(gguf_open(&f, "/nonexistent/x.gguf", err, sizeof err) == ANNA_EIO && f == NULL);

  /* Custom alignment moves the data section. */
  o.align = 64;
  buf b2 = build(&o);
  CHECK(gguf_open_buffer(&f, b2.p, b2.n, err, sizeof err) == 0);
  if (f) {
    CHECK(gguf_alignment(f) == 64 && gguf_data_offset(f) % 64 == 0);
    const gguf_tensor *t1 = gguf_tensor_find(f, "w1");
    CHECK(t1 && t1->offset == 64);
  }
  gguf_close(f);
  free(b2.p);
  free(b.p);
}

static void test_malformed(void) {
  opts o = honest();
  buf good = build(&o);
  char err[256];
  /* Every truncation of a valid file must fail cleanly (ASan catches overreads). */
  int n_ok = 0;
  for (size_t cut = 0; cut < good.n; cut++) {
    buf t = {good.p, cut, cut};
    if (try_open(&t, err, sizeof err) == 0) n_ok++;
  }
  CHECK(n_ok == 0);
  buf t = {good.p, 10, 10};
  expect_error("truncated header", &t);

  buf b;
  o = honest(); o.n_tensors_claim = 1ull << 60;
  b = build(&o); expect_error("lying tensor count", &b); free(b.p);
  o = honest(); o.n_tensors_claim = 3;
  b = build(&o); expect_error("tensor count one too many", &b); free(b.p);
  o = honest(); o.t1_offset = 1ull << 40;
  b = build(&o); expect_error("tensor offset out of file", &b); free(b.p);
  o = honest(); o.t1_offset = UINT64_MAX - 31;
  b = build(&o); expect_error("tensor offset wraps", &b); free(b.p);
  o = honest(); o.t1_offset = 33;
  b = build(&o); expect_error("misaligned tensor offset", &b); free(b.p);
  o = honest(); o.t1_type = 4; /* retired id */
  b = build(&o); expect_error("bad type id (retired)", &b); free(b.p);
  o = honest(); o.t1_type = 1000;
  b = build(&o); expect_error("bad type id (huge)", &b); free(b.p);
  o = honest(); o.t1_dim0 = 33;
  b = build(&o); expect_error("row not whole blocks", &b); free(b.p);
  o = honest(); o.t1_dim0 = 64;
  b = build(&o); expect_error("tensor bigger than file", &b); free(b.p);
  o = honest(); o.align = 48;
  b = build(&o); expect_error("alignment not power of 2", &b); free(b.p);

  /* Hand-patched cases on the honest image. */
  b = build(&k_honest);
  memcpy(b.p, "GGUX", 4);
  expect_error("bad magic", &b);
  free(b.p);
  b = build(&k_honest);
  { uint32_t v = 99; memcpy(b.p + 4, &v, 4); }
  expect_error("bad version", &b);
  free(b.p);
  b = build(&k_honest);
  { uint64_t v = 1ull << 62; memcpy(b.p + 24, &v, 8); } /* first key length */
  expect_error("huge key length", &b);
  free(b.p);
  b = build(&k_honest);
  { uint64_t v = UINT64_MAX; memcpy(b.p + 24 + 8 + 20 + 4, &v, 8); } /* first value string */
  expect_error("huge string length", &b);
  free(b.p);
  b = build(&k_honest);
  { uint32_t v = 77; memcpy(b.p + 24 + 8 + 20, &v, 4); } /* first value type */
  expect_error("bad value type", &b);
  free(b.p);
  b = build(&k_honest);
  { uint64_t v = 1ull << 61; memcpy(b.p + 16, &v, 8); }
  expect_error("lying kv count", &b);
  free(b.p);

  /* Hand-built tails: dims overflow, n_dims 5, array count lie, nested array. */
  buf h = {0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 1); u64(&h, 0);
  str(&h, "x"); u32(&h, 4); u64(&h, 1ull << 32); u64(&h, 1ull << 32); u64(&h, 1ull << 32);
  u64(&h, 1); u32(&h, ANNA_DTYPE_F32); u64(&h, 0);
  for (int k = 0; k < 64; k++) u8(&h, 0);
  expect_error("dims overflow int64", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 1); u64(&h, 0);
  str(&h, "x"); u32(&h, 1); u64(&h, 1ull << 40); u32(&h, ANNA_DTYPE_F32); u64(&h, 0);
  for (int k = 0; k < 64; k++) u8(&h, 0);
  expect_error("dims bigger than file", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 1); u64(&h, 0);
  str(&h, "x"); u32(&h, 5);
  for (int k = 0; k < 64; k++) u8(&h, 1);
  expect_error("n_dims 5", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 0); u64(&h, 1);
  str(&h, "arr"); u32(&h, GGUF_TYPE_ARRAY); u32(&h, GGUF_TYPE_UINT64); u64(&h, 1ull << 59);
  for (int k = 0; k < 64; k++) u8(&h, 1);
  expect_error("array count lie", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 0); u64(&h, 1);
  str(&h, "arr"); u32(&h, GGUF_TYPE_ARRAY); u32(&h, GGUF_TYPE_STRING); u64(&h, 4);
  str(&h, "a"); u64(&h, 1ull << 50);
  expect_error("string array lie", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 0); u64(&h, 1);
  str(&h, "arr"); u32(&h, GGUF_TYPE_ARRAY); u32(&h, GGUF_TYPE_ARRAY); u64(&h, 0);
  expect_error("nested array", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 2); u64(&h, 0);
  for (int k = 0; k < 2; k++) {
    str(&h, "dup"); u32(&h, 1); u64(&h, 8); u32(&h, ANNA_DTYPE_F32); u64(&h, 0);
  }
  pad_to(&h, 32);
  for (int k = 0; k < 32; k++) u8(&h, 0);
  expect_error("duplicate tensor name", &h);
  free(h.p);
  h = (buf){0};
  u32(&h, 0x46554747u); u32(&h, 3); u64(&h, 0); u64(&h, 2);
  str(&h, "k"); u32(&h, GGUF_TYPE_UINT8); u8(&h, 1);
  str(&h, "k"); u32(&h, GGUF_TYPE_UINT8); u8(&h, 2);
  expect_error("duplicate metadata key", &h);
  free(h.p);

  /* Random byte flips of the honest image: must never crash (result may be ok or error). */
  srand(1234);
  for (int it = 0; it < 3000; it++) {
    buf m = build(&k_honest);
    int flips = 1 + rand() % 4;
    for (int k = 0; k < flips; k++) m.p[rand() % m.n] = (uint8_t)rand();
    try_open(&m, err, sizeof err);
    free(m.p);
  }
  free(good.p);
}

int main(void) {
  test_valid();
  test_malformed();
  if (g_fail) {
    fprintf(stderr, "test_gguf: %d failures\n", g_fail);
    return 1;
  }
  printf("test_gguf: ok\n");
  return 0;
}
