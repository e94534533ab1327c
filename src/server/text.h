/*
 * text.h: the server's text helpers, each a small incremental state
 * machine fed with detokenized text as it arrives, so streaming and
 * non-streaming responses run the very same code:
 *
 *   token ids -> tok_stream (UTF-8 safe pieces) -> stop matcher -> think splitter -> deltas
 *
 *   strbuf          a growable byte string
 *   stop matcher    stop strings matched across token boundaries: the text
 *                   before the first match is released, the stop string and
 *                   everything after it never is. Text that could be the
 *                   start of a stop string is held back until it cannot.
 *   think splitter  Qwen3's "<think> ... </think>" at the start of the
 *                   output goes to reasoning_content, the rest to content.
 *                   A partial tag is held back; newlines around the tags
 *                   are dropped (as Qwen's own parsers do).
 *   tool parser     Qwen/Hermes tool calls in the content:
 *                   "<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>",
 *                   any number of them. A block whose JSON is a call
 *                   becomes a tool_call, anything else (bad JSON, a block
 *                   never closed) stays content, verbatim. Text that could
 *                   be the start of "<tool_call>", and a whole block until
 *                   its end tag, is held back; whitespace around the blocks
 *                   is dropped.
 */
#ifndef KILN_SERVER_TEXT_H
#define KILN_SERVER_TEXT_H

#include <stddef.h>

struct strbuf {
    char *p; /* NUL-terminated, or NULL while empty */
    size_t n, cap;
};

void sb_put(struct strbuf *b, const char *s, size_t n);
void sb_puts(struct strbuf *b, const char *s);
void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_clear(struct strbuf *b); /* length 0, keeps the memory */
void sb_free(struct strbuf *b);
/* the contents as a C string ("" when empty); stays owned by b */
const char *sb_str(const struct strbuf *b);

struct stop_matcher {
    char **stops; /* copies */
    int n_stops;
    struct strbuf hold;
    int hit; /* a stop string matched: nothing more is released */
};

void stop_init(struct stop_matcher *m, const char *const *stops, int n_stops);
void stop_free(struct stop_matcher *m);
/* Appends the text that is now safe to release to out; returns 1 when a
 * stop string matched (then and afterwards), else 0. */
int stop_feed(struct stop_matcher *m, const char *text, size_t len, struct strbuf *out);
/* End of output without a match: releases what was held back. */
void stop_flush(struct stop_matcher *m, struct strbuf *out);

enum think_state { THINK_START, THINK_REASONING, THINK_CONTENT };

struct think_splitter {
    enum think_state state;
    int in_reasoning_at_start; /* the prompt already opened <think> */
    int strip_lead;            /* drop whitespace before the next text */
    struct strbuf hold;
};

/* in_reasoning: the chat template ended the prompt inside <think>, so the
 * output starts as reasoning (and only "</think>" is expected). */
void think_init(struct think_splitter *t, int in_reasoning);
void think_free(struct think_splitter *t);
void think_feed(struct think_splitter *t, const char *text, size_t len, struct strbuf *reasoning, struct strbuf *content);
void think_flush(struct think_splitter *t, struct strbuf *reasoning, struct strbuf *content);

struct tool_call {
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd JSON text of an object, as OpenAI sends it */
};

struct tool_parser {
    int in_call;        /* inside <tool_call>, waiting for </tool_call> */
    int strip_lead;     /* drop whitespace before the next content (after a call) */
    struct strbuf hold; /* text not decided yet */
    struct strbuf pre;  /* whitespace dropped before the open tag: restored if the block is no call */
    struct tool_call *calls; /* every call parsed so far, in order */
    int n_calls, cap_calls;
};

void tool_init(struct tool_parser *t);
void tool_free(struct tool_parser *t);
/* Appends the text that is content for sure to content; complete calls
 * are appended to t->calls. */
void tool_feed(struct tool_parser *t, const char *text, size_t len, struct strbuf *content);
/* End of output: an unterminated block and held text become content. */
void tool_flush(struct tool_parser *t, struct strbuf *content);
/* Parses the text between the tags: a JSON object with a string "name" and
 * an object "arguments" (absent: {}; a string holding a JSON object is
 * accepted too). 0 with *out filled (the caller frees both strings), or -1
 * if it is not such a call. */
int tool_parse_call(const char *s, size_t n, struct tool_call *out);

/* The longest suffix of s[0..n) that is a proper prefix of pat. */
size_t text_partial_suffix(const char *s, size_t n, const char *pat);

#endif
