/* outparse.h: splits a model's generated text into what an OpenAI response carries: plain
 * content, reasoning, and tool calls, in the markup of the model's family:
 *
 *   tools   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5/3,
 *                        Hermes); a body in the XML form below is taken too. With tools on, a
 *                        whole reply that is just {"name": ..., "arguments": {...}}, bare or
 *                        inside a ```json fence (small Qwen coders answer so), is a call too
 *                        (as llama.cpp's Hermes/Qwen parser takes it).
 *           qwen3_coder  <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
 *                        </function>\n</tool_call> (Qwen3.5, Qwen3-Coder): each value is
 *                        converted by the type the tool's parameters schema gives P, as vLLM's
 *                        qwen3_coder parser does (strings stay raw; integer, number, boolean,
 *                        null, object/array parsed; a value that does not convert stays a
 *                        string); a {"name":..} JSON body is taken too.
 *           gemma4       <|tool_call>call:NAME{key:VALUE,...}<tool_call|>: strings between
 *                        <|"|> quotes, bare keys, nested {..} / [..], bare numbers, true,
 *                        false, null.
 *   reasoning qwen3      <think>...</think> (the template may open the block in the prompt)
 *           gemma4       <|channel>thought\n...<channel|> (the "thought\n" label dropped)
 *
 * Tool-call arguments always come out as the compact text of one JSON object that jansson
 * (and so any standard parser) reads back; a call whose body does not parse is content, as
 * written.
 *
 * Incremental: text arrives in arbitrary pieces (a tag may be split across pieces), and
 * every piece that can no longer be part of a tag goes out at once through the sink, so
 * streaming deltas are as early as possible; no byte of markup ever reaches content or
 * reasoning. With options.incremental, a call comes out as OUTPARSE_TOOL_NAME as soon as its
 * name is known, then OUTPARSE_TOOL_ARGS pieces whose concatenation is the arguments text
 * (qwen3_coder: a piece per parameter as each closes); without it, as one OUTPARSE_TOOL_CALL.
 * A parser is owned by one thread (the connection that renders the response); it never sees
 * the model or the engine.
 */
#ifndef ANNA_SERVER_OUTPARSE_H
#define ANNA_SERVER_OUTPARSE_H

#include <stddef.h>

enum outparse_kind {
  OUTPARSE_CONTENT = 0,
  OUTPARSE_REASONING = 1,
  OUTPARSE_TOOL_CALL = 2, /* a = function name, b = arguments as a JSON object text */
  OUTPARSE_TOOL_NAME = 3, /* incremental: a call starts; a = function name */
  OUTPARSE_TOOL_ARGS = 4, /* incremental: a = the next piece of the current call's arguments */
};

/* Tool-call and reasoning markup families (--tool-parser / --reasoning-parser). */
enum outparse_tools { OUTPARSE_TOOLS_NONE = 0, OUTPARSE_TOOLS_HERMES, OUTPARSE_TOOLS_QWEN3_CODER, OUTPARSE_TOOLS_GEMMA4 };
enum outparse_reasoning { OUTPARSE_REASONING_NONE = 0, OUTPARSE_REASONING_QWEN3, OUTPARSE_REASONING_GEMMA4 };
/* Server settings before resolution: pick by the chat template; not given at all. */
enum { OUTPARSE_AUTO = -2, OUTPARSE_UNSET = -3 };

/* a/b are borrowed for the duration of the call. Returns 0, or a negative code to stop. */
typedef int (*outparse_sink)(void *ud, int kind, const char *a, size_t alen, const char *b,
                             size_t blen);

typedef struct outparse outparse;

typedef struct outparse_options {
  int tools;              /* enum outparse_tools; NONE: calls are not parsed (content) */
  int reasoning;          /* enum outparse_reasoning; NONE: no reasoning split */
  int start_in_reasoning; /* the prompt already opened a reasoning block */
  int incremental;        /* calls as NAME + ARGS pieces instead of one TOOL_CALL */
  /* The request's "tools" array as JSON text (borrowed for outparse_new only; NULL: none):
   * qwen3_coder converts parameter values by these schemas. */
  const char *tools_json;
} outparse_options;

/* Caller frees with outparse_free. Returns NULL when out of memory. */
outparse *outparse_new_opts(const outparse_options *o);
/* The hermes + qwen3 parser as before families existed: reasoning and tools are on/off. */
outparse *outparse_new(int reasoning, int start_in_reasoning, int tools);
void outparse_free(outparse *p);
/* Feeds the next piece (len bytes, borrowed). final = 1 on the last call: everything held
 * back comes out (an unterminated tool call that parses is still a call, otherwise it is
 * content). Returns 0, the sink's negative code, or ANNA_ENOMEM. */
int outparse_feed(outparse *p, const char *s, size_t len, int final, outparse_sink sink, void *ud);
/* Number of tool calls emitted so far. */
int outparse_n_tool_calls(const outparse *p);

/* Parses one hermes tool-call body (the text between <tool_call> and </tool_call>, JSON or
 * the XML form, XML values typed by JSON parsing) into a name and a compact JSON object text
 * of the arguments. *name and *args: caller frees. Returns 0 or ANNA_EFORMAT when the body is
 * neither form. */
int outparse_tool_body(const char *body, size_t len, char **name, char **args);

/* Family names: "hermes", "qwen3_coder", "gemma4", "none" (tools); "qwen3", "gemma4", "none"
 * (reasoning). Return the enum value, or -1 for an unknown name. */
int outparse_tools_parse(const char *name);
int outparse_reasoning_parse(const char *name);
const char *outparse_tools_name(int tools);
const char *outparse_reasoning_name(int reasoning);
/* The families a chat template's text implies (NULL or len 0: hermes / qwen3, the markup of
 * the Qwen templates): <|tool_call> -> gemma4, <function= with <parameter= -> qwen3_coder,
 * else hermes; <|channel> -> gemma4, else qwen3. */
void outparse_detect(const char *template_src, size_t len, int *tools, int *reasoning);
/* The tags that open and close a reasoning block of a family (NULL for NONE). */
void outparse_reasoning_tags(int reasoning, const char **open, const char **close);

#endif
