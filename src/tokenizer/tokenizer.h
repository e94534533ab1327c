/*
 * tokenizer.h: text <-> token ids for the byte-level BPE family (Qwen2/2.5/3,
 * Llama 3, SmolLM2), the streaming detokenizer, and chat templates.
 *
 * Everything here follows Hugging Face `tokenizers` (Rust) exactly: encode is
 * encode(text, add_special_tokens=False), decode is decode(ids,
 * skip_special_tokens). Chat templates follow transformers'
 * apply_chat_template (Jinja with trim_blocks and lstrip_blocks).
 *
 * A loaded tokenizer is immutable apart from an internal, mutex-protected
 * word cache, so one tokenizer may be shared by many threads.
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct kiln_tokenizer;

/* Loads MODEL_DIR/tokenizer.json and, if present, MODEL_DIR/tokenizer_config.json
 * (chat_template, eos/bos/pad tokens, add_bos_token) and MODEL_DIR/chat_template.jinja
 * (which wins over the config's template, as in transformers). NULL + err on failure. */
struct kiln_tokenizer *tok_load(const char *model_dir, char *err, size_t errlen);

/* The same from a tokenizer.json text already in memory (no config, no template). */
struct kiln_tokenizer *tok_load_json(const char *json, size_t len, char *err, size_t errlen);

void tok_free(struct kiln_tokenizer *t);

/* Highest id + 1, added tokens included. */
int tok_vocab_size(const struct kiln_tokenizer *t);

/* encode(text, add_special_tokens=False) exactly as HF tokenizers does. *ids is
 * malloc'd (the caller frees it; may be NULL when *n_ids is 0). Returns 0 or -1.
 * Invalid UTF-8 is first repaired as Python's bytes.decode("utf-8", "replace")
 * would (HF receives a Python str), so it never fails on bad bytes. */
int tok_encode(const struct kiln_tokenizer *t, const char *text, size_t len, int32_t **ids,
               int *n_ids, char *err, size_t errlen);

/* decode(ids, skip_special_tokens=skip_special) as HF does: malloc'd,
 * NUL-terminated, *len = byte count (len may be NULL). Out-of-range ids:
 * NULL with err. */
char *tok_decode(const struct kiln_tokenizer *t, const int32_t *ids, int n_ids, int skip_special,
                 size_t *len, char *err, size_t errlen);

/* Id of a vocab token (spelled as in tokenizer.json, e.g. "Ġthe") or an added
 * token ("<|im_end|>"); -1 if none. */
int tok_token_id(const struct kiln_tokenizer *t, const char *token_text);

/* 1 if id is an added token marked special (skipped by skip_special), else 0. */
int tok_is_special(const struct kiln_tokenizer *t, int32_t id);

/* From tokenizer_config.json, or NULL. Owned by the tokenizer. */
const char *tok_eos_token(const struct kiln_tokenizer *t);
const char *tok_bos_token(const struct kiln_tokenizer *t);
const char *tok_pad_token(const struct kiln_tokenizer *t);
int tok_add_bos_token(const struct kiln_tokenizer *t); /* add_bos_token, 0 if absent */
const char *tok_chat_template(const struct kiln_tokenizer *t); /* NULL if the model has none */

/* The raw bytes one id decodes to before UTF-8 repair (byte-level mapped for
 * vocab tokens). NULL for out-of-range ids. Used by the streaming decoder. */
const uint8_t *tok_id_bytes(const struct kiln_tokenizer *t, int32_t id, size_t *len);

/* Repairs UTF-8 as Rust's from_utf8_lossy / Python's errors="replace" do: one
 * U+FFFD per maximal invalid subpart. Appends to *out (realloc'd; *cap its
 * capacity, *out_len its length, kept NUL-terminated). When final is 0 a
 * trailing sequence that is valid so far but incomplete is left unconsumed.
 * Returns the number of input bytes consumed. */
size_t tok_utf8_repair(const uint8_t *s, size_t n, int final, char **out, size_t *out_len,
                       size_t *cap);

/* ==== streaming detokenizer ==== */

/* Push ids one by one; each push returns the bytes that are now complete
 * UTF-8 text and final. The concatenation of everything pushed and flushed
 * equals tok_decode of all the ids. */
struct tok_stream;
struct tok_stream *tok_stream_new(const struct kiln_tokenizer *t, int skip_special);
/* Appends the newly final text to *out (malloc'd NUL-terminated, possibly ""),
 * *out_len = its length. 0, or -1 for an out-of-range id (nothing consumed). */
int tok_stream_push(struct tok_stream *s, int32_t id, char **out, size_t *out_len);
/* Whatever is still held back (an incomplete UTF-8 tail is emitted as HF's
 * decode would render it, U+FFFD). The stream can be reused afterwards. */
int tok_stream_flush(struct tok_stream *s, char **out, size_t *out_len);
void tok_stream_free(struct tok_stream *s);

/* ==== chat templates ==== */

/* messages_json: either a JSON array of messages or an object {"messages": [...],
 * "tools": [...]} (OpenAI shapes: role, content (string or list of
 * {type:text,text}), reasoning_content, tool_calls with function.arguments as
 * a JSON string or object, tool_call_id, name). Other keys of the object are
 * passed to the template as variables too. enable_thinking: -1 leaves it
 * undefined in the template, 0/1 defines it. Returns malloc'd text or NULL
 * with err (naming the construct and the template line on unsupported syntax). */
char *tok_apply_chat_template(const struct kiln_tokenizer *t, const char *messages_json,
                              int add_generation_prompt, int enable_thinking, char *err,
                              size_t errlen);

/* The same with an explicit template text (tests, kiln serve --chat-template FILE).
 * bos_token/eos_token may be NULL (then they are undefined in the template). */
char *tok_render_template(const char *template_text, const char *messages_json,
                          int add_generation_prompt, int enable_thinking, const char *bos_token,
                          const char *eos_token, char *err, size_t errlen);

#endif
