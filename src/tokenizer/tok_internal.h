/*
 * tok_internal.h: the layout of a loaded tokenizer, shared by load.c (which
 * builds it from tokenizer.json) and bpe.c (which encodes and decodes with
 * it). Nothing outside src/tokenizer/ includes this.
 *
 * Decision: BPE runs on raw bytes, not on the byte-level "Ġ" alphabet. Vocab
 * strings and merges are translated back to bytes once at load, so encoding
 * never builds byte-level strings; a merge is a hash lookup on a pair of ids.
 */
#ifndef KILN_TOK_INTERNAL_H
#define KILN_TOK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* string -> id, open addressing; keys live in one byte arena, in insertion
 * order. A slot holds the key's hash (high 32 bits) and its index + 1 into
 * keys (low 32 bits; 0 = empty), so a probe that misses reads no key; a key
 * of up to 8 bytes is also packed into head, so a hit on it reads no arena
 * (load touches these maps ~600k times: fewer cache misses matter). */
struct tok_strkey {
    uint64_t head; /* n <= 8: the bytes, packed as tok_key_of does */
    uint32_t off, len;
    int32_t id;
    uint32_t hash;
};

struct tok_strmap {
    uint64_t *slots;
    uint32_t mask;
    uint32_t n;
    struct tok_strkey *keys;
    uint32_t cap_keys;
    uint8_t *arena;
    size_t arena_len, arena_cap;
};

/* (left id, right id) -> (rank, merged id), open addressing */
struct tok_merge_slot {
    uint64_t key; /* ((uint64_t)left << 32 | right) + 1, 0 = empty */
    int32_t rank, id;
};

struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
};

enum tok_pre_type { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_DIGITS };

struct tok_pre {
    enum tok_pre_type type;
    pcre2_code *re;        /* SPLIT, or BYTELEVEL with use_regex */
    int add_prefix_space;  /* BYTELEVEL */
    int individual_digits; /* DIGITS */
};

/* one slot of the direct-mapped word cache: key bytes then ids in blob */
struct tok_cache_slot {
    uint64_t hash;
    uint8_t *blob;
    uint32_t klen, n_ids;
};
#define TOK_CACHE_SLOTS (1u << 16)
#define TOK_CACHE_LOCKS 64
#define TOK_CACHE_MAX_WORD 256

struct kiln_tokenizer {
    struct tok_strmap vocab; /* raw bytes -> id (model vocab only) */
    struct tok_merge_slot *merges;
    uint32_t merges_mask;
    int32_t byte_id[256]; /* id of each single byte, -1 if absent */
    int ignore_merges;
    int nfc;

    struct tok_added *added; /* sorted by decreasing length */
    int n_added;
    uint8_t added_first[2][256]; /* [normalized] first bytes of added tokens */

    struct tok_pre *pre;
    int n_pre;

    int n_vocab;             /* highest id + 1 */
    uint32_t *id_off;        /* decode bytes of id i: id_bytes[id_off[i] .. id_off[i+1]) */
    uint8_t *id_bytes;
    uint8_t *id_special;     /* 1 for special added tokens */
    char **id_text;          /* token text as spelled in tokenizer.json (NULL for holes) */

    struct tok_cache_slot *cache;
    pthread_mutex_t cache_lock[TOK_CACHE_LOCKS];

    char *eos_token, *bos_token, *pad_token, *chat_template;
    int add_bos_token;
};

/* byte-level alphabet (GPT-2 bytes_to_unicode): codepoint of byte b, and the
 * byte of codepoint c (-1 if c is not in the alphabet) */
extern uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(int32_t cp);
void tok_bytelevel_init(void);

uint32_t tok_hash_bytes(const uint8_t *s, size_t n);
int tok_strmap_put(struct tok_strmap *m, const uint8_t *s, size_t n, int32_t id);
int32_t tok_strmap_get(const struct tok_strmap *m, const uint8_t *s, size_t n);
void tok_strmap_free(struct tok_strmap *m);

/* byte-level text ("Ġthe") -> raw bytes; returns 0, or -1 when some char is
 * outside the alphabet (then *out holds the UTF-8 unchanged). *out malloc'd. */
int tok_bytelevel_to_bytes(const char *s, size_t n, uint8_t **out, size_t *out_len);

#endif
