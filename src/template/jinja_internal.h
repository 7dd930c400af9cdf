/* jinja_internal.h: shared types of the Jinja interpreter (not a public header).
 *
 * Memory: everything a parse or a render allocates comes from one arena (jarena) that is
 * released as a whole, so values are plain structs passed by copy and never individually
 * freed. The parse arena lives as long as the template; a render arena lives for one render.
 * The AST (jnode) is immutable after parsing, so renders can share it.
 */
#ifndef ANNA_TEMPLATE_JINJA_INTERNAL_H
#define ANNA_TEMPLATE_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "template/jinja.h"

/* ---- arena ---- */
typedef struct jarena_block jarena_block;
typedef struct jarena {
  jarena_block *head;
  size_t used_total; /* bytes handed out, checked against limit */
  size_t limit;      /* 0 = unlimited */
  int failed;        /* set once an allocation failed or hit the limit */
} jarena;

void *jarena_alloc(jarena *a, size_t n); /* zeroed; NULL on failure (a->failed set) */
char *jarena_strndup(jarena *a, const char *s, size_t n);
void jarena_free_all(jarena *a);

/* ---- values ---- */
typedef enum jv_type {
  JV_UNDEF,
  JV_NONE,
  JV_BOOL,
  JV_INT,
  JV_FLOAT,
  JV_STR,
  JV_LIST, /* also tuples (is_tuple) */
  JV_DICT, /* also namespaces (is_ns) */
  JV_MACRO,
  JV_BUILTIN, /* global function, u.fn = builtin id */
  JV_METHOD,  /* bound method: u.m */
} jv_type;

typedef struct jstr {
  size_t len;
  int markup; /* markupsafe.Markup (from |safe, |escape): `+` HTML-escapes plain operands */
  char s[];   /* NUL-terminated, UTF-8 */
} jstr;

struct jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmethod jmethod;
typedef struct jmacro jmacro;

typedef struct jv {
  jv_type t;
  union {
    int b;
    int64_t i;
    double f;
    jstr *s;
    jlist *l;
    jdict *d;
    jmacro *mac;
    int fn;
    jmethod *m;
  } u;
} jv;

struct jlist {
  size_t n, cap;
  jv *items;
  int is_tuple;
};

struct jdict {
  size_t n, cap;
  jv *keys; /* insertion order kept (Python dict order); strings except in dict literals */
  jv *vals;
  int is_ns;
};

struct jmethod {
  jv self;
  const char *name;
};

/* ---- AST ---- */
typedef enum jnode_kind {
  /* statements */
  JN_BODY, /* kids = statements */
  JN_TEXT, /* str */
  JN_OUTPUT, /* a = expr */
  JN_IF, /* a = cond, b = then body, c = else body (or NULL) */
  JN_FOR, /* kids = target names (JN_NAME), a = iter, b = body, c = else body, d = filter */
  JN_SET, /* a = target (JN_NAME / JN_GETATTR / JN_TUPLE), b = value */
  JN_SET_BLOCK, /* a = target name, b = body, d = filter chain applied (JN_FILTER on JN_NAME "") */
  JN_MACRO, /* str = name, kids = params (JN_NAME, with a = default or NULL), b = body */
  JN_FILTER_BLOCK, /* b = body, a = filter chain applied to JN_BLOCKVAL */
  JN_BREAK,
  JN_CONTINUE,
  JN_CALL_BLOCK, /* a = JN_CALL, d = JN_MACRO "caller" (params + body) */
  /* expressions */
  JN_LIT, /* lit */
  JN_NAME, /* str */
  JN_GETATTR, /* a = obj, str = name */
  JN_GETITEM, /* a = obj, b = key */
  JN_SLICE, /* a = obj, kids[0..2] = start, stop, step (may be NULL) */
  JN_CALL, /* a = callee, kids = args (JN_KWARG for keyword) */
  JN_KWARG, /* str = name, a = value */
  JN_SPLAT, /* a = value; op 1 = *args, 2 = **kwargs */
  JN_FILTER, /* a = operand, str = name, kids = args */
  JN_TEST, /* a = operand, str = name, kids = args, op = negated */
  JN_BINOP, /* op, a, b */
  JN_CMP, /* a = first, kids = operands, ops in cmpops */
  JN_NOT, /* a */
  JN_NEG, /* a */
  JN_POS, /* a */
  JN_AND, /* a, b */
  JN_OR, /* a, b */
  JN_COND, /* a = cond, b = then, c = else (may be NULL) */
  JN_LIST, /* kids */
  JN_TUPLE, /* kids */
  JN_DICT, /* kids = alternating key, value */
  JN_CONCAT, /* kids joined with ~ */
  JN_BLOCKVAL, /* placeholder for the rendered body in a filter block / set block */
} jnode_kind;

enum jop {
  JOP_ADD = 1,
  JOP_SUB,
  JOP_MUL,
  JOP_DIV,
  JOP_FLOORDIV,
  JOP_MOD,
  JOP_POW,
  JOP_EQ,
  JOP_NE,
  JOP_LT,
  JOP_LE,
  JOP_GT,
  JOP_GE,
  JOP_IN,
  JOP_NOTIN,
};

typedef struct jnode jnode;
struct jnode {
  jnode_kind kind;
  int line;
  int op;
  jnode *a, *b, *c, *d;
  jnode **kids;
  size_t nkids;
  int *cmpops;
  jstr *str;
  jv lit;
};

struct jmacro {
  const jnode *def;
  struct jscope *closure;
};

struct jinja_template {
  jarena arena;
  jnode *root;
};

/* ---- values (jinja_value.c) ---- */
jstr *jstr_new(jarena *a, const char *s, size_t n);
jv jv_str(jarena *a, const char *s, size_t n);
jv jv_cstr(jarena *a, const char *s);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_bool(int b);
jv jv_none(void);
jv jv_undef(void);
jlist *jlist_new(jarena *a, size_t cap);
int jlist_push(jarena *a, jlist *l, jv v); /* 0 or -1 on allocation failure */
jdict *jdict_new(jarena *a, size_t cap);
int jdict_set(jarena *a, jdict *d, jstr *key, jv v); /* replaces an existing key */
jv *jdict_get(const jdict *d, const char *key, size_t klen); /* string key; NULL when absent */
jv *jdict_getv(const jdict *d, jv key);                      /* any key, Python equality */
int jdict_setv(jarena *a, jdict *d, jv key, jv v);
int jstr_eq(const jstr *a, const char *s, size_t n);

int jv_truthy(jv v);
int jv_equal(jv a, jv b);
/* Three-way comparison for sorting and </>: returns 0 and sets *cmp, or -1 when the types
 * cannot be ordered (Python would raise TypeError). */
int jv_compare(jv a, jv b, int *cmp);
const char *jv_type_name(jv v);

/* Converts a JSON value (borrowed) into arena values. */
jv jv_from_json(jarena *a, const json_t *j, int depth);

/* Growable byte buffer for rendering/printing, allocated with malloc (not the arena) because
 * the final output is handed to the caller. */
typedef struct jbuf {
  char *p;
  size_t n, cap;
  size_t limit; /* 0 = unlimited */
  int failed;   /* 1 = out of memory, 2 = over limit */
} jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_free(jbuf *b);

/* Python str(v) (what {{ v }} prints) and repr(v), appended to b. */
void jv_print(jbuf *b, jv v);
void jv_repr(jbuf *b, jv v);
/* json.dumps(v, ensure_ascii=flags & JTOJSON_ASCII, indent=indent (<0 = None),
 * separators=(item_sep, key_sep) (NULL = Python's defaults), sort_keys=flags &
 * JTOJSON_SORT_KEYS). Returns 0 or -1 when v holds something JSON cannot encode (msg says
 * what). */
enum { JTOJSON_SORT_KEYS = 1, JTOJSON_ASCII = 2 };
int jv_tojson(jbuf *b, jv v, int indent, const char *item_sep, const char *key_sep, int flags,
              int depth, const char **msg);
/* Python float repr (shortest round-trip): "1.0", "1e+20", "0.30000000000000004". */
void jfloat_repr(char *out, size_t cap, double f);

/* UTF-8 helpers: number of code points; byte offset of code point index i. */
size_t jutf8_len(const char *s, size_t n);
size_t jutf8_offset(const char *s, size_t n, size_t cp);

/* ---- render context (jinja_render.c, jinja_builtins.c) ---- */
typedef struct jscope {
  struct jscope *parent;
  jdict *vars;
} jscope;

typedef struct jctx {
  jarena a;
  jbuf *out;        /* where text goes now (macro calls and set blocks redirect it) */
  jscope *globals;  /* the render variables */
  jinja_limits lim;
  size_t out_limit; /* remaining budget shared by all buffers */
  int64_t steps;
  int depth;
  int line;         /* line of the node being evaluated, for messages */
  int flow;         /* JFLOW_* after break/continue */
  jv next_caller;   /* `caller` handed to the macro called next by a call block */
  char *err;
  size_t errlen;
  int failed;       /* an error message has been written */
} jctx;

enum { JFLOW_NONE = 0, JFLOW_BREAK, JFLOW_CONTINUE };

typedef struct jargs {
  jv *pos;
  size_t npos;
  jstr **kwn;
  jv *kwv;
  size_t nkw;
} jargs;

int jctx_err(jctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Counts work against max_steps: one step per call plus one per 64 bytes / 8 items an
 * operation scans, so that a loop of cheap-looking operations on huge strings still ends. */
int jctx_charge(jctx *c, jv v);
int jctx_nomem(jctx *c);
/* Positional argument idx or keyword `name` (NULL = positional only); JV_UNDEF with
 * *found = 0 when absent. */
jv jargs_get(const jargs *a, size_t idx, const char *name, int *found);

/* Builtins (jinja_builtins.c). Names are looked up at parse time too so that an unknown
 * filter or test is a parse error, as in jinja2. */
int jinja_filter_known(const char *name, size_t n);
int jinja_test_known(const char *name, size_t n);
int jinja_global_id(const char *name, size_t n); /* < 0 when not a builtin global */
int jinja_apply_filter(jctx *c, const char *name, jv v, const jargs *args, jv *out);
int jinja_apply_test(jctx *c, const char *name, jv v, const jargs *args, int *out);
int jinja_call_builtin(jctx *c, int fn, const jargs *args, jv *out);
int jinja_call_method(jctx *c, jv self, const char *name, const jargs *args, jv *out);
/* Attribute lookup `obj.name` with jinja2 rules (methods before keys for dicts). */
jv jinja_getattr(jctx *c, jv obj, const char *name, size_t n);
jv jinja_getitem(jctx *c, jv obj, jv key);
/* Calls a macro value with args (used by the `call` path and `map`). */
int jinja_call_macro(jctx *c, jv mac, const jargs *args, jv *out);
/* Iterable to list: lists as is, dict keys, string characters, undefined = empty. */
int jinja_to_list(jctx *c, jv v, jlist **out);
/* Python str() of v as an arena string. */
jstr *jinja_to_str(jctx *c, jv v);

#endif
