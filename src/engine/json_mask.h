/*
 * json_mask.h: constrained decoding to one JSON object (OpenAI's
 * response_format {"type": "json_object"}).
 *
 *   json_fsm    an incremental validator: a pushdown state machine fed one
 *               byte at a time, which rejects the first byte that cannot
 *               continue a valid JSON text (RFC 8259; UTF-8 is checked
 *               inside strings, only ASCII is valid outside them). The
 *               text must start with the top-level object's '{' (no
 *               whitespace first); the machine is done when that object
 *               closes.
 *   json_vocab  every token's bytes, built once per tokenizer, and the
 *               per-step mask: the logit of every token whose bytes would
 *               make the output so far invalid becomes -inf.
 *
 * Two limits keep the machine small and the model from running away:
 * containers nest at most JSON_MAX_DEPTH deep (the stack is one bit per
 * level: object or array), and at most JSON_MAX_WS whitespace bytes may
 * follow each other between tokens of the JSON text (the classic failure
 * of JSON modes is a model that emits newlines forever).
 */
#ifndef KILN_JSON_MASK_H
#define KILN_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 64
#define JSON_MAX_WS 32

struct json_fsm {
    uint64_t stack;         /* bit d set: the container at depth d is an object, else an array */
    uint8_t mode;           /* where we are (json_mask.c: enum json_mode) */
    uint8_t depth;          /* open containers */
    uint8_t sub;            /* number sub-state, literal position or \u digits seen */
    uint8_t lit;            /* which literal (true, false, null) */
    uint8_t key;            /* the string being read is an object key */
    uint8_t ws;             /* whitespace bytes in a row */
    uint8_t u8_need;        /* UTF-8 continuation bytes still due in a string */
    uint8_t u8_lo, u8_hi;   /* the range of the next continuation byte */
};

/* Before the first byte: only '{' may come. */
void json_fsm_init(struct json_fsm *f);
/* Feeds one byte: 0 when the text is still a valid prefix (f advanced),
 * -1 when it is not (f is then undefined: feed a copy to try a byte). */
int json_fsm_feed(struct json_fsm *f, uint8_t c);
/* Feeds n bytes; 0, or -1 at the first invalid one. */
int json_fsm_feed_bytes(struct json_fsm *f, const void *s, size_t n);
/* 1 when the top-level object has closed (nothing more may follow). */
int json_fsm_done(const struct json_fsm *f);

struct json_vocab;

/* The bytes token id decodes to, or NULL for a token that may never be
 * emitted under the constraint (special tokens, ids the tokenizer does not
 * have). */
typedef const uint8_t *(*json_token_bytes)(void *ctx, int32_t id, size_t *len);

/* Builds the table for a vocabulary of n_vocab ids (the logits row):
 * asks bytes() for each id once. eos ids are allowed only once the object
 * is complete. Never NULL (allocation failures abort, as everywhere). */
struct json_vocab *json_vocab_new(int n_vocab, json_token_bytes bytes, void *ctx, const int32_t *eos, int n_eos);
void json_vocab_free(struct json_vocab *v);

/* Sets logits[id] = -inf for every id that cannot follow state f: tokens
 * whose bytes would make the text invalid, tokens with no bytes, and EOS
 * until f is done. With a byte-level vocabulary (every byte is a token) at
 * least one token stays allowed in every state the machine can reach.
 * Read-only on v: several threads may mask at once. */
void json_vocab_mask(const struct json_vocab *v, const struct json_fsm *f, float *logits);
/* Advances f by token id's bytes: 0, or -1 if they are invalid there (an
 * EOS id is accepted when f is done). */
int json_vocab_accept(const struct json_vocab *v, struct json_fsm *f, int32_t id);

#endif
