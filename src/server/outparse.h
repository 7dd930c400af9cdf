/* outparse.h: splits a model's generated text into what an OpenAI response carries:
 * plain content, reasoning (DeepSeek-style <think>...</think>), and tool calls written as
 * Qwen-style <tool_call>{"name": ..., "arguments": {...}}</tool_call> or Qwen3.5 XML
 * <tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>. With tools on,
 * a whole reply that is just {"name": ..., "arguments": {...}}, bare or inside a ```json fence
 * (small Qwen coders answer so), is a call too (as llama.cpp's Hermes/Qwen parser takes it).
 *
 * Incremental: text arrives in arbitrary pieces (a tag may be split across pieces), and
 * every piece that can no longer be part of a tag goes out at once through the sink, so
 * streaming deltas are as early as possible. A parser is owned by one thread (the
 * connection that renders the response); it never sees the model or the engine.
 */
#ifndef ANNA_SERVER_OUTPARSE_H
#define ANNA_SERVER_OUTPARSE_H

#include <stddef.h>

enum outparse_kind {
  OUTPARSE_CONTENT = 0,
  OUTPARSE_REASONING = 1,
  OUTPARSE_TOOL_CALL = 2, /* a = function name, b = arguments as a JSON object text */
};

/* a/b are borrowed for the duration of the call. Returns 0, or a negative code to stop. */
typedef int (*outparse_sink)(void *ud, int kind, const char *a, size_t alen, const char *b,
                             size_t blen);

typedef struct outparse outparse;

/* reasoning: split <think> blocks; start_in_reasoning: the prompt already opened one (the
 * template ended the generation prompt with "<think>"); tools: parse <tool_call> blocks.
 * Caller frees with outparse_free. Returns NULL when out of memory. */
outparse *outparse_new(int reasoning, int start_in_reasoning, int tools);
void outparse_free(outparse *p);
/* Feeds the next piece (len bytes, borrowed). final = 1 on the last call: everything held
 * back comes out (an unterminated tool call that parses is still a call, otherwise it is
 * content). Returns 0, the sink's negative code, or ANNA_ENOMEM. */
int outparse_feed(outparse *p, const char *s, size_t len, int final, outparse_sink sink, void *ud);
/* Number of tool calls emitted so far. */
int outparse_n_tool_calls(const outparse *p);

/* Parses one tool-call body (the text between <tool_call> and </tool_call>) into a name and
 * a compact JSON object text of the arguments. *name and *args: caller frees. Returns 0 or
 * ANNA_EFORMAT when the body is neither form. */
int outparse_tool_body(const char *body, size_t len, char **name, char **args);

#endif
