/*
 * load.c: builds a struct kiln_tokenizer from tokenizer.json (and the chat
 * template and special tokens from tokenizer_config.json / chat_template.jinja).
 *
 * Owns: the byte-level alphabet, the vocab and merge hash maps, the added
 * tokens, the pre-tokenizer steps (PCRE2 regexes compiled with JIT), and the
 * per-id decode bytes. It does not encode (bpe.c does).
 *
 * Decisions:
 * - Only the byte-level BPE family is accepted. Anything else (a model other
 *   than BPE, a normalizer other than NFC, a pre-tokenizer other than Split /
 *   ByteLevel / Digits, a decoder other than ByteLevel) is refused at load
 *   with an error naming it, rather than silently encoding differently.
 * - The HF regexes are Oniguruma syntax; the constructs these files use
 *   (\p{L}, \p{N}, (?i:...), \s+(?!\S)) mean the same in PCRE2 with
 *   PCRE2_UTF | PCRE2_UCP, so patterns are passed through unchanged.
 * - model.vocab and model.merges (nearly all of the 11 MB Qwen3 file) never
 *   become a cJSON tree (that alone took ~50 ms and ~600k allocations). One
 *   pass of json_scan.c validates the whole text and reads the two straight
 *   into the maps as it meets them (merges that come before the vocab are
 *   read from their byte range afterwards); the rest of the file, with the
 *   two values replaced by {} and [], is small and goes to cJSON. Token
 *   strings are converted in a reused buffer and copied once into the map's
 *   arena: no allocation per token. The file is mapped, not read.
 * - Errors keep their old order: invalid JSON anywhere first (with the byte
 *   offset and what was expected), then the model checks, then the vocab's
 *   content, then the merges'.
 * - Member lookup follows cJSON (the first "model", "vocab", "merges" key,
 *   compared as C strings), so the scanner and cJSON always agree on which
 *   value is which. Vocab and merge strings themselves are exact, unescaped
 *   bytes: a \u0000 inside one is a NUL byte of the token (cJSON's C
 *   strings cut the token there), and \u escapes with bad hex digits are
 *   refused (cJSON read them as U+0000).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, localtime_r, strncasecmp */
#endif
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "tokenizer/json_scan.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ==== byte-level alphabet ==== */

uint16_t tok_byte_to_cp[256];
/* 384: every codepoint a two-byte sequence with lead byte C0..C5 can spell
 * (the alphabet ends at 323), so bytelevel_into needs no bounds check */
static int16_t cp_to_byte_tab[384];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void) {
    /* GPT-2: printable Latin-1 bytes keep their codepoint, the others are
     * numbered 256, 257, ... in byte order */
    int n = 0;
    for (int i = 0; i < 384; i++) cp_to_byte_tab[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        tok_byte_to_cp[b] = (uint16_t)(keep ? b : 256 + n++);
        cp_to_byte_tab[tok_byte_to_cp[b]] = (int16_t)b;
    }
}

void tok_bytelevel_init(void) { pthread_once(&bytelevel_once, bytelevel_build); }

int tok_cp_to_byte(int32_t cp) { return cp >= 0 && cp < 324 ? cp_to_byte_tab[cp] : -1; }

/* tok_bytelevel_to_bytes into o: 0, or -1 with the UTF-8 copied unchanged;
 * *out_len the byte count. Like it, a two-byte sequence is read as
 * ((lead & 0x1F) << 6) | (next & 0x3F) without further checks. o needs room
 * for n bytes. (Eight-byte runs of plain ASCII did not pay: tokens are short
 * and most start with a two-byte character such as Ġ.) */
static int bytelevel_into(const uint8_t *p, size_t n, uint8_t *o, size_t *out_len) {
    const uint8_t *q = p, *e = p + n;
    uint8_t *w = o;
    while (q < e) {
        uint32_t c = *q;
        int b;
        if (c < 0x80) {
            b = cp_to_byte_tab[c];
            q++;
        } else if (c >= 0xC0 && c <= 0xC5 && e - q >= 2) {
            b = cp_to_byte_tab[((c & 0x1F) << 6) | (q[1] & 0x3F)];
            q += 2;
        } else {
            b = -1; /* other leads are two-byte codepoints >= 0x180 or longer sequences */
        }
        if (b < 0) { /* outside the alphabet: keep the UTF-8 as is */
            if (n) memcpy(o, p, n);
            *out_len = n;
            return -1;
        }
        *w++ = (uint8_t)b;
    }
    *out_len = (size_t)(w - o);
    return 0;
}

int tok_bytelevel_to_bytes(const char *s, size_t n, uint8_t **out, size_t *out_len) {
    *out = kiln_malloc(n + 1);
    return bytelevel_into((const uint8_t *)s, n, *out, out_len);
}

/* ==== hash maps ==== */

/* calloc for the big slot tables (MBs): their pages are made present in one
 * call instead of faulting in one by one. A hash table reads a slot before
 * writing it, so each fresh page would fault twice (the zero page, then a
 * private copy); with 2-3k pages per table that is milliseconds. Only a
 * hint: a kernel without MADV_POPULATE_WRITE (Linux < 5.14) refuses it and
 * the pages fault in as before. */
static void *calloc_populated(size_t n, size_t size) {
    void *p = kiln_calloc(n, size);
#ifdef MADV_POPULATE_WRITE
    size_t bytes = n * size;
    long pg = sysconf(_SC_PAGESIZE);
    if (bytes >= (1u << 20) && pg > 0) {
        uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
        uintptr_t e = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
        if (e > a) madvise((void *)a, e - a, MADV_POPULATE_WRITE);
    }
#endif
    return p;
}

/* The hash, and for keys of up to 8 bytes a word that holds them all (with
 * the length, it identifies the key): tokens are mostly 1..12 bytes, read as
 * at most two overlapping words, with a final 64-bit mix. */
struct tok_key {
    uint32_t hash;
    uint64_t head;
};

static inline struct tok_key tok_key_of(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0xFF51AFD7ED558CCDull), a, b, head;
    while (n > 16) {
        memcpy(&a, s, 8);
        memcpy(&b, s + 8, 8);
        h = (h ^ a) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 31) ^ b) * 0x94D049BB133111EBull;
        s += 16, n -= 16;
    }
    if (n >= 8) {
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
        head = a; /* all of it when n == 8 */
    } else if (n >= 4) { /* the first and the last four bytes */
        uint32_t x, y;
        memcpy(&x, s, 4);
        memcpy(&y, s + n - 4, 4);
        a = x, b = y;
        head = a | b << 32;
    } else { /* bytes 0, n/2, n-1: all of them when n <= 3 */
        a = n ? (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16 : 0;
        b = 0;
        head = a;
    }
    h = (h ^ a) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 31) ^ b) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    return (struct tok_key){(uint32_t)h ^ (uint32_t)(h >> 32), head};
}

uint32_t tok_hash_bytes(const uint8_t *s, size_t n) { return tok_key_of(s, n).hash; }

static void strmap_init(struct tok_strmap *m, uint32_t n_expected) {
    uint32_t cap = 64;
    while (cap < n_expected * 2) cap <<= 1;
    m->slots = calloc_populated(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->n = 0;
    m->cap_keys = n_expected > 16 ? n_expected : 16;
    m->keys = kiln_malloc(m->cap_keys * sizeof *m->keys);
    m->arena_cap = (size_t)m->cap_keys * 8;
    m->arena = kiln_malloc(m->arena_cap);
    m->arena_len = 0;
}

/* doubles the slots (the keys keep their hashes, so nothing is rehashed) */
static void strmap_grow(struct tok_strmap *m) {
    uint32_t cap = (m->mask + 1) * 2;
    free(m->slots);
    m->slots = calloc_populated(cap, sizeof *m->slots);
    m->mask = cap - 1;
    for (uint32_t k = 0; k < m->n; k++) {
        uint32_t i = m->keys[k].hash & m->mask;
        while (m->slots[i]) i = (i + 1) & m->mask;
        m->slots[i] = (uint64_t)m->keys[k].hash << 32 | (k + 1);
    }
}

/* the slot of key s (or the empty slot where it would go) */
static inline uint32_t strmap_find(const struct tok_strmap *m, const uint8_t *s, size_t n, struct tok_key key) {
    for (uint32_t i = key.hash & m->mask;; i = (i + 1) & m->mask) {
        uint64_t sl = m->slots[i];
        if (!sl) return i;
        if ((uint32_t)(sl >> 32) != key.hash) continue;
        const struct tok_strkey *k = &m->keys[(uint32_t)sl - 1];
        if (k->len == n && (n <= 8 ? k->head == key.head : !memcmp(m->arena + k->off, s, n))) return i;
    }
}

/* Inserts or overwrites. The slots grow to stay at most half full. */
static void strmap_put_key(struct tok_strmap *m, const uint8_t *s, size_t n, struct tok_key key, int32_t id) {
    uint32_t i = strmap_find(m, s, n, key);
    if (m->slots[i]) {
        m->keys[(uint32_t)m->slots[i] - 1].id = id;
        return;
    }
    if ((m->n + 1) * 2 > m->mask + 1) {
        strmap_grow(m);
        i = strmap_find(m, s, n, key);
    }
    if (m->n == m->cap_keys) {
        m->cap_keys *= 2;
        m->keys = kiln_realloc(m->keys, m->cap_keys * sizeof *m->keys);
    }
    while (m->arena_len + n > m->arena_cap) {
        m->arena_cap *= 2;
        m->arena = kiln_realloc(m->arena, m->arena_cap);
    }
    if (n) memcpy(m->arena + m->arena_len, s, n);
    struct tok_strkey *k = &m->keys[m->n];
    k->head = n <= 8 ? key.head : 0;
    k->off = (uint32_t)m->arena_len;
    k->len = (uint32_t)n;
    k->id = id;
    k->hash = key.hash;
    m->arena_len += n;
    m->n++;
    m->slots[i] = (uint64_t)key.hash << 32 | m->n;
}

int tok_strmap_put(struct tok_strmap *m, const uint8_t *s, size_t n, int32_t id) {
    strmap_put_key(m, s, n, tok_key_of(s, n), id);
    return 0;
}

/* the index in keys of key s, or -1 */
static int64_t strmap_index(const struct tok_strmap *m, const uint8_t *s, size_t n) {
    uint32_t i = strmap_find(m, s, n, tok_key_of(s, n));
    return m->slots[i] ? (int64_t)(uint32_t)m->slots[i] - 1 : -1;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const uint8_t *s, size_t n) {
    if (!m->slots) return -1;
    uint32_t i = strmap_find(m, s, n, tok_key_of(s, n));
    return m->slots[i] ? m->keys[(uint32_t)m->slots[i] - 1].id : -1;
}

void tok_strmap_free(struct tok_strmap *m) {
    free(m->slots);
    free(m->keys);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static void merges_init(struct kiln_tokenizer *t, uint32_t n_expected) {
    uint32_t cap = 64;
    while (cap < n_expected * 2) cap <<= 1;
    free(t->merges);
    t->merges = calloc_populated(cap, sizeof *t->merges);
    t->merges_mask = cap - 1;
}

/* n: the distinct merges already in the table (it grows to stay at most half
 * full); returns 1 if this one was new, 0 for a repeat */
static int merge_put(struct kiln_tokenizer *t, uint32_t n, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((n + 1) * 2 > t->merges_mask + 1) { /* double, and put every merge back */
        struct tok_merge_slot *old = t->merges;
        uint32_t old_cap = t->merges_mask + 1;
        t->merges = NULL;
        merges_init(t, old_cap);
        for (uint32_t j = 0; j < old_cap; j++) {
            if (!old[j].key) continue;
            uint64_t h = old[j].key * 0x9E3779B97F4A7C15ull;
            uint32_t i = (uint32_t)(h >> 32) & t->merges_mask;
            while (t->merges[i].key) i = (i + 1) & t->merges_mask;
            t->merges[i] = old[j];
        }
        free(old);
    }
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 32) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        if (t->merges[i].key == key) return 0; /* a repeated merge keeps its first rank, as HF */
        if (!t->merges[i].key) {
            t->merges[i].key = key, t->merges[i].rank = rank, t->merges[i].id = id;
            return 1;
        }
    }
}

/* ==== tokenizer.json sections ==== */

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int json_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int load_normalizer(struct kiln_tokenizer *t, const cJSON *n, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = json_str(n, "type");
    if (type && !strcmp(type, "NFC")) {
        t->nfc = 1;
        return 0;
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            if (load_normalizer(t, it, err, errlen)) return -1;
        }
        return 0;
    }
    return kiln_errf(err, errlen, "unsupported normalizer type '%s' (only NFC, or a Sequence of NFC)",
                     type ? type : "?");
}

/* GPT-2's own split, used by ByteLevel when use_regex is true */
static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static pcre2_code *regex_compile(const char *pat, size_t len, uint32_t extra, char *err, size_t errlen) {
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP | extra, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        kiln_errf(err, errlen, "pre_tokenizer regex /%.80s/: %s at offset %zu", pat, (char *)msg, (size_t)off);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter still works */
    return re;
}

static struct tok_pre *pre_add(struct kiln_tokenizer *t) {
    t->pre = kiln_realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *t->pre);
    struct tok_pre *p = &t->pre[t->n_pre++];
    memset(p, 0, sizeof *p);
    return p;
}

static int load_pre(struct kiln_tokenizer *t, const cJSON *p, char *err, size_t errlen) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = json_str(p, "type");
    if (!type) return kiln_errf(err, errlen, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
            if (load_pre(t, it, err, errlen)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const char *behavior = json_str(p, "behavior");
        if (!behavior || strcmp(behavior, "Isolated"))
            return kiln_errf(err, errlen, "unsupported Split behavior '%s' (only Isolated)", behavior ? behavior : "?");
        if (json_bool(p, "invert", 0)) return kiln_errf(err, errlen, "unsupported Split with invert: true");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = json_str(pat, "Regex"), *lit = json_str(pat, "String");
        if (!rx && !lit) return kiln_errf(err, errlen, "Split pre_tokenizer without a Regex or String pattern");
        pcre2_code *re = rx ? regex_compile(rx, strlen(rx), 0, err, errlen)
                            : regex_compile(lit, strlen(lit), PCRE2_LITERAL, err, errlen);
        if (!re) return -1;
        struct tok_pre *s = pre_add(t);
        s->type = TOK_PRE_SPLIT;
        s->re = re;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        struct tok_pre *s = pre_add(t);
        s->type = TOK_PRE_BYTELEVEL;
        s->add_prefix_space = json_bool(p, "add_prefix_space", 1);
        if (json_bool(p, "use_regex", 1)) {
            s->re = regex_compile(gpt2_regex, sizeof gpt2_regex - 1, 0, err, errlen);
            if (!s->re) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Digits")) {
        struct tok_pre *s = pre_add(t);
        s->type = TOK_PRE_DIGITS;
        s->individual_digits = json_bool(p, "individual_digits", 0);
        return 0;
    }
    return kiln_errf(err, errlen, "unsupported pre_tokenizer type '%s' (only Sequence, Split, ByteLevel, Digits)", type);
}

static int load_decoder(const cJSON *d, char *err, size_t errlen) {
    if (!d || cJSON_IsNull(d)) return kiln_errf(err, errlen, "tokenizer.json has no decoder (a ByteLevel decoder is required)");
    const char *type = json_str(d, "type");
    if (type && !strcmp(type, "ByteLevel")) return 0;
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        int n = 0;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(d, "decoders")) {
            if (load_decoder(it, err, errlen)) return -1;
            n++;
        }
        return n ? 0 : kiln_errf(err, errlen, "empty decoder Sequence");
    }
    return kiln_errf(err, errlen, "unsupported decoder type '%s' (only ByteLevel)", type ? type : "?");
}

/* ==== model.vocab and model.merges, read straight from the text ==== */

/* a value's byte range in the text; n: its members or elements */
struct big_member {
    int found;
    size_t off, len, n;
};

/* a reused, growing buffer (keeps its contents when it grows) */
struct scratch {
    uint8_t *p;
    size_t cap;
};

static uint8_t *scratch_get(struct scratch *b, size_t n) {
    if (n > b->cap || !b->p) {
        b->cap = n > 256 ? n * 2 : 512;
        b->p = kiln_realloc(b->p, b->cap);
    }
    return b->p;
}

#define BATCH 32

/* What the one pass over the text found and built. model.vocab is read into
 * the map as the pass meets it, and model.merges too if the vocab came first
 * (as in every file HF writes); merges before the vocab are read afterwards
 * from their range. Errors in their content are kept, not reported at once:
 * a syntax error anywhere, and load_model's earlier checks, come first. */
struct scan {
    struct kiln_tokenizer *t;
    struct big_member vocab, merges; /* the values replaced for cJSON */
    int vocab_done;                  /* the vocab is in t->vocab (or vocab_err is set) */
    int merges_later;                /* merges met before the vocab: read the range afterwards */
    char vocab_err[512], merges_err[512];
    struct scratch pair;
    uint32_t next_key;   /* where the next merged token is expected in vocab.keys */
    uint32_t n_distinct; /* distinct merges in the table */
    /* Vocab entries and merges wait in small batches, parsed and converted,
     * while the hash-table lines they need are prefetched; then they go in,
     * in file order. One at a time, each waited for two or three cache
     * misses in a row (the tables are MBs, the lookups random): most of
     * the load time. batch holds their raw bytes. */
    struct scratch batch;
    size_t batch_used;
    int n_pend;
    struct pending {
        const uint8_t *a, *b; /* merges: the byte-level texts, in the JSON text (for messages) */
        uint32_t al, bl;
        uint32_t off, abl, bbl; /* raw bytes in batch: a (vocab: the key), then b */
        struct tok_key ka, kb;
        int32_t ia, ib, im; /* merges: ids; vocab: ia is the id */
        int rank;
    } pend[BATCH];
};

/* room for n more raw bytes in the batch */
static uint8_t *batch_room(struct scan *sc, size_t n) { return scratch_get(&sc->batch, sc->batch_used + n); }

/* key == name as cJSON_GetObjectItemCaseSensitive compares them (C strings:
 * an unescaped NUL ends the key) */
static int key_is(const uint8_t *k, size_t n, const char *name) {
    const uint8_t *z = n ? memchr(k, 0, n) : NULL;
    if (z) n = (size_t)(z - k);
    size_t m = strlen(name);
    return n == m && !memcmp(k, name, m);
}

/* bytes of a string to print in a message: up to the first NUL, at most max */
static int print_len(const uint8_t *s, size_t n, size_t max) {
    const uint8_t *z = n ? memchr(s, 0, n) : NULL;
    if (z) n = (size_t)(z - s);
    return (int)(n < max ? n : max);
}

static int is_num_start(int c) { return c == '-' || (c >= '0' && c <= '9'); }

/* the waiting vocab entries into the map, in file order (a repeated key takes
 * the later id, as before) */
static void vocab_flush(struct scan *sc) {
    struct tok_strmap *m = &sc->t->vocab;
    for (int i = 0; i < sc->n_pend; i++) {
        const struct pending *e = &sc->pend[i];
        strmap_put_key(m, sc->batch.p + e->off, e->abl, e->ka, e->ia);
    }
    sc->n_pend = 0, sc->batch_used = 0;
}

/* model.vocab at the cursor: each key -> raw bytes (in a reused buffer) ->
 * the map, whose arena holds all token bytes. -1 only on a syntax error. */
static int scan_vocab(struct scan *sc, struct js *s) {
    struct kiln_tokenizer *t = sc->t;
    /* The map grows, but each doubling costs fresh pages; sized from the text
     * (HF files spend ~75 bytes per vocab entry: 11.4 MB for Qwen3's 151k)
     * it does not need to. */
    size_t est = (size_t)(s->end - s->base) / 64;
    strmap_init(&t->vocab, est < 1024 ? 1024 : est > (1u << 22) ? 1u << 22 : (uint32_t)est);
    sc->n_pend = 0, sc->batch_used = 0;
    int first = 1, r;
    const uint8_t *k;
    size_t kl;
    if (js_obj_open(s)) return -1;
    while ((r = js_obj_next(s, &first, &k, &kl)) == 1) {
        sc->vocab.n++;
        int c = js_peek(s);
        double d = -1;
        if (is_num_start(c)) {
            if (js_number(s, &d)) return -1;
        }
        /* cJSON's valueint; INT_MAX itself is refused (n_vocab would overflow) */
        if (!is_num_start(c) || d < 0 || d > 0x7ffffffe) {
            if (!sc->vocab_err[0])
                snprintf(sc->vocab_err, sizeof sc->vocab_err, "model.vocab['%.*s']: id is not a non-negative integer",
                         print_len(k, kl, 40), (const char *)k);
            if (!is_num_start(c) && js_skip(s, NULL)) return -1;
            continue;
        }
        if (sc->vocab_err[0]) continue;
        int32_t id = (int32_t)d;
        size_t bl;
        uint8_t *b = batch_room(sc, kl) + sc->batch_used;
        bytelevel_into(k, kl, b, &bl);
        struct pending *e = &sc->pend[sc->n_pend++];
        e->off = (uint32_t)sc->batch_used, e->abl = (uint32_t)bl, e->ia = id;
        e->ka = tok_key_of(b, bl);
        __builtin_prefetch(&t->vocab.slots[e->ka.hash & t->vocab.mask]);
        sc->batch_used += bl;
        if (sc->n_pend == BATCH) vocab_flush(sc);
        if (id >= t->n_vocab) t->n_vocab = id + 1;
    }
    if (r < 0) return -1;
    if (!sc->vocab_err[0]) vocab_flush(sc);
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        t->byte_id[i] = tok_strmap_get(&t->vocab, &c, 1);
    }
    sc->vocab_done = 1;
    return 0;
}

/* The waiting merges: the ids of a, b and a+b -> the merge table, in rank
 * order. 0, or 1 with merges_err set (for the first merge that fails). */
static int merges_flush(struct scan *sc) {
    struct kiln_tokenizer *t = sc->t;
    const struct tok_strmap *v = &t->vocab;
    int n = sc->n_pend;
    sc->n_pend = 0, sc->batch_used = 0;
    /* the slots were prefetched when queued: now the keys they point to */
    for (int i = 0; i < n; i++) {
        const struct pending *e = &sc->pend[i];
        uint64_t sa = v->slots[e->ka.hash & v->mask], sb = v->slots[e->kb.hash & v->mask];
        if (sa) __builtin_prefetch(&v->keys[(uint32_t)sa - 1]);
        if (sb) __builtin_prefetch(&v->keys[(uint32_t)sb - 1]);
    }
    for (int i = 0; i < n; i++) {
        struct pending *e = &sc->pend[i];
        const uint8_t *ra = sc->batch.p + e->off, *rb = ra + e->abl;
        uint32_t sa = strmap_find(v, ra, e->abl, e->ka), sb = strmap_find(v, rb, e->bbl, e->kb);
        e->ia = v->slots[sa] ? v->keys[(uint32_t)v->slots[sa] - 1].id : -1;
        e->ib = v->slots[sb] ? v->keys[(uint32_t)v->slots[sb] - 1].id : -1;
        /* a+b: in the files HF writes, merge r makes the token after the one
         * merge r-1 made (vocab and merges are both in training order), so
         * look at that key first; keys are distinct, so a byte match is the
         * map's answer. This turns ~150k random probes into a sequential walk. */
        size_t len = (size_t)e->abl + e->bbl;
        uint32_t k = sc->next_key;
        e->im = -1;
        if (k < v->n && v->keys[k].len == len && (!len || !memcmp(v->arena + v->keys[k].off, ra, len))) {
            e->im = v->keys[k].id;
        } else {
            int64_t ki = strmap_index(v, ra, len);
            if (ki >= 0) e->im = v->keys[ki].id, k = (uint32_t)ki;
        }
        sc->next_key = k + 1;
        if (e->ia < 0 || e->ib < 0 || e->im < 0) {
            snprintf(sc->merges_err, sizeof sc->merges_err, "merge %d ('%.*s' + '%.*s'): token not in vocab",
                     e->rank, (int)e->al, (const char *)e->a, (int)e->bl, (const char *)e->b);
            return 1;
        }
        uint64_t key = (((uint64_t)(uint32_t)e->ia << 32) | (uint32_t)e->ib) + 1;
        __builtin_prefetch(&t->merges[(uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & t->merges_mask]);
    }
    for (int i = 0; i < n; i++) {
        const struct pending *e = &sc->pend[i];
        sc->n_distinct += (uint32_t)merge_put(t, sc->n_distinct, e->ia, e->ib, e->rank, e->im);
    }
    return 0;
}

/* Queues merge a + b (byte-level texts that stay valid until the flush):
 * converted, hashed, its vocab slots prefetched. 0, or 1 with merges_err. */
static int add_merge(struct scan *sc, const uint8_t *a, size_t al, const uint8_t *b, size_t bl, int rank) {
    const struct tok_strmap *v = &sc->t->vocab;
    uint8_t *ra = batch_room(sc, al + bl) + sc->batch_used, *rb;
    struct pending *e = &sc->pend[sc->n_pend++];
    size_t abl, bbl;
    bytelevel_into(a, al, ra, &abl);
    rb = ra + abl;
    bytelevel_into(b, bl, rb, &bbl);
    e->a = a, e->al = (uint32_t)al, e->b = b, e->bl = (uint32_t)bl, e->rank = rank;
    e->off = (uint32_t)sc->batch_used, e->abl = (uint32_t)abl, e->bbl = (uint32_t)bbl;
    e->ka = tok_key_of(ra, abl), e->kb = tok_key_of(rb, bbl);
    __builtin_prefetch(&v->slots[e->ka.hash & v->mask]);
    __builtin_prefetch(&v->slots[e->kb.hash & v->mask]);
    sc->batch_used += abl + bbl;
    return sc->n_pend == BATCH ? merges_flush(sc) : 0;
}

/* One merge, "a b" or ["a", "b"], at the cursor. 0 done, 1 a content error
 * (in merges_err), -1 a syntax error. */
static int scan_merge(struct scan *sc, struct js *s, int rank) {
    const uint8_t *p = s->p, *e = s->end, *a, *b, *q;
    size_t al, bl;
    /* the usual shapes, strings without escapes, straight from the text */
    if (p < e && *p == '[' && s->depth < JS_MAX_DEPTH) {
        if ((p = js_ws_(p + 1, e)) < e && *p == '"' && (q = js_plain_end_(p + 1, e))) {
            a = p + 1, al = (size_t)(q - a);
            if ((p = js_ws_(q + 1, e)) < e && *p == ',' && (p = js_ws_(p + 1, e)) < e && *p == '"' &&
                (q = js_plain_end_(p + 1, e))) {
                b = p + 1, bl = (size_t)(q - b);
                if ((p = js_ws_(q + 1, e)) < e && *p == ']') {
                    s->p = p + 1;
                    return add_merge(sc, a, al, b, bl, rank);
                }
            }
        }
    } else if (p < e && *p == '"' && (q = js_plain_end_(p + 1, e))) {
        a = p + 1;
        const uint8_t *sp = memchr(a, ' ', (size_t)(q - a));
        if (sp && !memchr(sp + 1, ' ', (size_t)(q - sp - 1))) {
            s->p = q + 1;
            return add_merge(sc, a, (size_t)(sp - a), sp + 1, (size_t)(q - sp - 1), rank);
        }
    }
    /* anything else (escapes, errors): js_string's buffer is reused, so the
     * waiting merges go first and this one is flushed at once */
    if (sc->n_pend && merges_flush(sc)) return 1;
    const uint8_t *x;
    size_t xl;
    int c = js_peek(s), f2 = 1;
    if (c == '"') {
        if (js_string(s, &x, &xl)) return -1;
        const uint8_t *sp = xl ? memchr(x, ' ', xl) : NULL;
        if (!sp || memchr(sp + 1, ' ', xl - (size_t)(sp + 1 - x))) {
            snprintf(sc->merges_err, sizeof sc->merges_err, "merge %d ('%.*s') is not two tokens", rank,
                     print_len(x, xl, 60), (const char *)x);
            return 1;
        }
        return add_merge(sc, x, (size_t)(sp - x), sp + 1, xl - (size_t)(sp - x) - 1, rank) || merges_flush(sc);
    }
    /* ["a", "b"], copied into pair as "a b": js_string reuses its buffer */
    if (c != '[' || js_arr_open(s) || js_arr_next(s, &f2) != 1 || js_peek(s) != '"') goto neither;
    if (js_string(s, &x, &xl)) return -1;
    uint8_t *pb = scratch_get(&sc->pair, xl + 1);
    memcpy(pb, x, xl);
    al = xl;
    if (js_arr_next(s, &f2) != 1 || js_peek(s) != '"') goto neither;
    if (js_string(s, &x, &xl)) return -1;
    pb = scratch_get(&sc->pair, al + 1 + xl);
    memcpy(pb + al + 1, x, xl);
    if (js_arr_next(s, &f2) != 0) goto neither;
    return add_merge(sc, pb, al, pb + al + 1, xl, rank) || merges_flush(sc);
neither:
    if (s->err) return -1;
    snprintf(sc->merges_err, sizeof sc->merges_err, "merge %d is neither \"a b\" nor [a, b]", rank);
    return 1;
}

/* model.merges at the cursor (the vocab is complete). -1 only on a syntax
 * error; after a content error the rest is only validated. */
static int scan_merges(struct scan *sc, struct js *s, size_t n_expected) {
    merges_init(sc->t, n_expected > 16 ? (uint32_t)n_expected : 16);
    int first = 1, r, rank = 0;
    sc->n_distinct = 0, sc->n_pend = 0, sc->batch_used = 0;
    if (js_arr_open(s)) return -1;
    while ((r = js_arr_next(s, &first)) == 1) {
        sc->merges.n++;
        if (sc->merges_err[0]) {
            if (js_skip(s, NULL)) return -1;
            continue;
        }
        const uint8_t *at = s->p;
        int depth = s->depth, rc = scan_merge(sc, s, rank);
        if (rc < 0) return -1;
        if (rc > 0) { /* validate the element again, whole */
            s->p = at, s->depth = depth;
            if (js_skip(s, NULL)) return -1;
        }
        rank++;
    }
    if (r == 0 && !sc->merges_err[0] && sc->n_pend) merges_flush(sc);
    return r;
}

static int scan_model(struct scan *sc, struct js *s) {
    if (js_obj_open(s)) return -1;
    int first = 1, r, seen_vocab = 0, seen_merges = 0;
    const uint8_t *k;
    size_t kl;
    while ((r = js_obj_next(s, &first, &k, &kl)) == 1) {
        size_t off = (size_t)(s->p - s->base);
        struct big_member *m = NULL;
        if (!seen_vocab && key_is(k, kl, "vocab")) {
            seen_vocab = 1;
            if (js_peek(s) == '{') {
                m = &sc->vocab;
                if (scan_vocab(sc, s)) return -1;
            }
        } else if (!seen_merges && key_is(k, kl, "merges")) {
            seen_merges = 1;
            if (js_peek(s) == '[') {
                m = &sc->merges;
                if (sc->vocab_done && !sc->vocab_err[0]) { /* about one merge per vocab entry */
                    if (scan_merges(sc, s, sc->vocab.n)) return -1;
                } else { /* before the vocab (or after a bad one): just its range */
                    sc->merges_later = !sc->vocab_done;
                    if (js_skip(s, &m->n)) return -1;
                }
            }
        }
        if (!m && js_skip(s, NULL)) return -1;
        if (m) m->found = 1, m->off = off, m->len = (size_t)(s->p - s->base) - off;
    }
    return r;
}

static int scan_error(const struct js *s, char *err, size_t errlen) {
    return kiln_errf(err, errlen, "tokenizer.json is not valid JSON (near byte %zu: %s)", s->err_off,
                     s->err ? s->err : "unexpected input");
}

/* The one pass: validates the whole text (the root object; bytes after it
 * are ignored, as cJSON_ParseWithLength does) and reads model.vocab and
 * model.merges on the way. */
static int scan_doc(struct scan *sc, const char *json, size_t len, char *err, size_t errlen) {
    if (!json || !len) return kiln_errf(err, errlen, "tokenizer.json is not valid JSON (it is empty)");
    struct js s;
    size_t off = len >= 5 && !memcmp(json, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a UTF-8 BOM, as cJSON */
    js_init(&s, json, off, len - off, 0);
    int first = 1, seen_model = 0, c = js_peek(&s);
    const uint8_t *k;
    size_t kl;
    if (c != '{') js_fail(&s, c < 0 ? "no value" : "the top level is not an object");
    else if (!js_obj_open(&s))
        while (js_obj_next(&s, &first, &k, &kl) == 1) {
            if (!seen_model && key_is(k, kl, "model")) {
                seen_model = 1;
                if (js_peek(&s) == '{') {
                    if (scan_model(sc, &s)) break;
                    continue;
                }
            }
            if (js_skip(&s, NULL)) break;
        }
    js_free(&s);
    return s.err ? scan_error(&s, err, errlen) : 0;
}

/* The text with model.vocab replaced by {} and model.merges by [], for cJSON. */
static char *strip_big(const char *json, size_t len, const struct scan *sc, size_t *out_len) {
    const struct big_member *r[2] = {&sc->vocab, &sc->merges};
    const char *repl[2] = {"{}", "[]"};
    if (sc->vocab.found && sc->merges.found && sc->merges.off < sc->vocab.off) {
        r[0] = &sc->merges, r[1] = &sc->vocab;
        repl[0] = "[]", repl[1] = "{}";
    }
    size_t cut = (sc->vocab.found ? sc->vocab.len : 0) + (sc->merges.found ? sc->merges.len : 0);
    char *out = kiln_malloc(len - cut + 5), *o = out;
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        if (!r[i]->found) continue;
        memcpy(o, json + at, r[i]->off - at);
        o += r[i]->off - at;
        memcpy(o, repl[i], 2);
        o += 2;
        at = r[i]->off + r[i]->len;
    }
    memcpy(o, json + at, len - at);
    o += len - at;
    *o = 0;
    *out_len = (size_t)(o - out);
    return out;
}

static int load_model(struct kiln_tokenizer *t, const cJSON *m, const char *json, struct scan *sc, char *err,
                      size_t errlen) {
    if (!cJSON_IsObject(m)) return kiln_errf(err, errlen, "tokenizer.json has no model object");
    const char *type = json_str(m, "type");
    if (type && strcmp(type, "BPE"))
        return kiln_errf(err, errlen, "unsupported tokenizer model type '%s' (only BPE)", type);
    const char *pfx = json_str(m, "continuing_subword_prefix"), *sfx = json_str(m, "end_of_word_suffix");
    if ((pfx && *pfx) || (sfx && *sfx))
        return kiln_errf(err, errlen, "BPE with continuing_subword_prefix/end_of_word_suffix is not supported");
    if (json_bool(m, "byte_fallback", 0)) return kiln_errf(err, errlen, "BPE with byte_fallback is not supported");
    t->ignore_merges = json_bool(m, "ignore_merges", 0);

    /* in the cJSON tree these are the {} and [] that stood in for the real ones */
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsObject(vocab)) return kiln_errf(err, errlen, "model.vocab missing or not an object");
    if (!cJSON_IsArray(merges)) return kiln_errf(err, errlen, "model.merges missing or not an array");
    if (!sc->vocab_done || !sc->merges.found) /* cannot happen: both find members the same way */
        return kiln_errf(err, errlen, "model.vocab/model.merges: the scanner and cJSON disagree");
    if (sc->vocab_err[0]) return kiln_errf(err, errlen, "%s", sc->vocab_err);
    if (sc->merges_later) { /* the merges came before the vocab: read them now */
        struct js s;
        js_init(&s, json, sc->merges.off, sc->merges.len, 2);
        size_t n = sc->merges.n;
        sc->merges.n = 0;
        int rc = scan_merges(sc, &s, n);
        if (rc) scan_error(&s, err, errlen); /* cannot happen: the pass validated it */
        js_free(&s);
        if (rc) return -1;
    }
    if (sc->merges_err[0]) return kiln_errf(err, errlen, "%s", sc->merges_err);
    return 0;
}

static int added_cmp(const void *a, const void *b) {
    const struct tok_added *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0;
}

static int load_added(struct kiln_tokenizer *t, const cJSON *arr, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(arr);
    t->added = kiln_calloc((size_t)n + 1, sizeof *t->added);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const char *content = json_str(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!content || !cJSON_IsNumber(id) || id->valueint < 0)
            return kiln_errf(err, errlen, "added_tokens[%d]: needs a content string and an id", t->n_added);
        if (!*content) continue;
        struct tok_added *a = &t->added[t->n_added++];
        a->content = kiln_strdup(content);
        a->len = strlen(content);
        a->id = id->valueint;
        a->special = (uint8_t)json_bool(it, "special", 0);
        a->lstrip = (uint8_t)json_bool(it, "lstrip", 0);
        a->rstrip = (uint8_t)json_bool(it, "rstrip", 0);
        a->single_word = (uint8_t)json_bool(it, "single_word", 0);
        a->normalized = (uint8_t)json_bool(it, "normalized", !a->special);
        if (a->id >= t->n_vocab) t->n_vocab = a->id + 1;
        t->added_first[a->normalized][(uint8_t)content[0]] = 1;
    }
    /* longest first: the first candidate that matches at a position is the
     * leftmost-longest match HF's Aho-Corasick would report */
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    return 0;
}

/* decode bytes per id: vocab tokens are already raw bytes in the map's arena;
 * added tokens go through the ByteLevel decoder rule (all chars in the
 * alphabet -> their bytes, otherwise the UTF-8 as is) */
static void build_decode_table(struct kiln_tokenizer *t) {
    size_t total = t->vocab.arena_len;
    for (int i = 0; i < t->n_added; i++) total += t->added[i].len;
    /* id_off first holds each id's source (later ones win, added tokens
     * last): 0 none, k + 1 vocab key k, ADDED | i added token i; one pass in
     * id order then turns it into offsets, so no per-id scratch arrays */
    const uint32_t ADDED = 0x80000000u;
    t->id_off = kiln_calloc((size_t)t->n_vocab + 1, sizeof *t->id_off);
    t->id_special = kiln_calloc((size_t)t->n_vocab, 1);
    uint8_t **owned = kiln_calloc((size_t)t->n_added + 1, sizeof *owned);
    size_t *owned_len = kiln_calloc((size_t)t->n_added + 1, sizeof *owned_len);
    for (uint32_t k = 0; k < t->vocab.n; k++) t->id_off[t->vocab.keys[k].id] = k + 1;
    for (int i = 0; i < t->n_added; i++) {
        tok_bytelevel_to_bytes(t->added[i].content, t->added[i].len, &owned[i], &owned_len[i]);
        t->id_off[t->added[i].id] = ADDED | (uint32_t)i;
        t->id_special[t->added[i].id] = t->added[i].special;
    }
    t->id_bytes = kiln_malloc(total + 1);
    uint32_t off = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        uint32_t w = t->id_off[id];
        t->id_off[id] = off;
        if (!w) continue;
        const uint8_t *src;
        size_t len;
        if (w & ADDED) {
            src = owned[w & ~ADDED], len = owned_len[w & ~ADDED];
        } else {
            src = t->vocab.arena + t->vocab.keys[w - 1].off, len = t->vocab.keys[w - 1].len;
        }
        if (len) memcpy(t->id_bytes + off, src, len);
        off += (uint32_t)len;
    }
    t->id_off[t->n_vocab] = off;
    for (int i = 0; i < t->n_added; i++) free(owned[i]);
    free(owned);
    free(owned_len);
}

struct kiln_tokenizer *tok_load_json(const char *json, size_t len, char *err, size_t errlen) {
    tok_bytelevel_init();
    struct kiln_tokenizer *t = kiln_calloc(1, sizeof *t);
    for (int i = 0; i < TOK_CACHE_LOCKS; i++) pthread_mutex_init(&t->cache_lock[i], NULL);
    struct scan *sc = kiln_calloc(1, sizeof *sc);
    sc->t = t;
    cJSON *root = NULL;
    if (scan_doc(sc, json, len, err, errlen)) goto fail;
    size_t rest_len;
    char *rest = strip_big(json, len, sc, &rest_len);
    root = cJSON_ParseWithLength(rest, rest_len);
    free(rest);
    if (!root || !cJSON_IsObject(root)) { /* cannot happen: cJSON accepts all the scanner does */
        kiln_errf(err, errlen, "tokenizer.json is not valid JSON (cJSON refused it)");
        goto fail;
    }
    if (load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), json, sc, err, errlen) ||
        load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen) ||
        load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen) ||
        load_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), err, errlen) ||
        load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err, errlen))
        goto fail;
    cJSON_Delete(root);
    free(sc->pair.p);
    free(sc->batch.p);
    free(sc);
    build_decode_table(t);
    t->cache = kiln_calloc(TOK_CACHE_SLOTS, sizeof *t->cache);
    return t;
fail:
    cJSON_Delete(root);
    free(sc->pair.p);
    free(sc->batch.p);
    free(sc);
    tok_free(t);
    return NULL;
}

/* eos_token & co. are a string or an AddedToken object {"content": ...} */
static char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return kiln_strdup(v->valuestring);
    const char *c = json_str(v, "content");
    return c ? kiln_strdup(c) : NULL;
}

static int load_config(struct kiln_tokenizer *t, const char *dir, char *err, size_t errlen) {
    char *path = kiln_path_join(dir, "tokenizer_config.json");
    if (kiln_file_exists(path)) {
        size_t n;
        char *text = kiln_read_file(path, &n, err, errlen);
        if (!text) {
            free(path);
            return -1;
        }
        cJSON *cfg = cJSON_ParseWithLength(text, n);
        free(text);
        if (!cfg) {
            kiln_errf(err, errlen, "%s is not valid JSON", path);
            free(path);
            return -1;
        }
        t->eos_token = config_token(cfg, "eos_token");
        t->bos_token = config_token(cfg, "bos_token");
        t->pad_token = config_token(cfg, "pad_token");
        t->add_bos_token = json_bool(cfg, "add_bos_token", 0);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct)) t->chat_template = kiln_strdup(ct->valuestring);
        else if (cJSON_IsArray(ct)) { /* [{name, template}, ...]: the "default" one */
            const cJSON *it;
            cJSON_ArrayForEach(it, ct) {
                const char *name = json_str(it, "name"), *tpl = json_str(it, "template");
                if (name && tpl && !strcmp(name, "default")) t->chat_template = kiln_strdup(tpl);
            }
        }
        cJSON_Delete(cfg);
    }
    free(path);
    path = kiln_path_join(dir, "chat_template.jinja");
    if (kiln_file_exists(path)) {
        char *text = kiln_read_file(path, NULL, err, errlen);
        if (!text) {
            free(path);
            return -1;
        }
        free(t->chat_template);
        t->chat_template = text;
    }
    free(path);
    return 0;
}

/* The text of one token (special ones included), malloc'd, or NULL. */
static char *token_text(const struct kiln_tokenizer *t, int64_t id) {
    if (id < 0 || id >= tok_vocab_size(t)) return NULL;
    int32_t i = (int32_t)id;
    return tok_decode(t, &i, 1, 0, NULL, NULL, 0);
}

/* A GGUF file carries its tokenizer in tokenizer.ggml.* metadata: the GGUF
 * reader synthesizes the equivalent tokenizer.json; the chat template and the
 * special tokens come from tokenizer.chat_template and the *_token_id keys. */
static struct kiln_tokenizer *tok_load_gguf(const char *path, char *err, size_t errlen) {
    struct kiln_file f;
    if (kiln_file_map(&f, path, err, errlen)) return NULL;
    struct gguf_file g;
    struct kiln_tokenizer *t = NULL;
    if (kiln_gguf_parse(&g, f.data, f.size, path, err, errlen) == 0) {
        char *json = NULL;
        size_t len = 0;
        if (kiln_gguf_tokenizer_json(&g, &json, &len, err, errlen) == 0) t = tok_load_json(json, len, err, errlen);
        free(json);
        if (t) {
            int64_t id;
            t->chat_template = kiln_gguf_get_str(&g, "tokenizer.chat_template");
            if (kiln_gguf_get_int(&g, "tokenizer.ggml.eos_token_id", &id, NULL, 0) == 0) t->eos_token = token_text(t, id);
            if (kiln_gguf_get_int(&g, "tokenizer.ggml.bos_token_id", &id, NULL, 0) == 0) t->bos_token = token_text(t, id);
        }
        kiln_gguf_free(&g);
    }
    kiln_file_unmap(&f);
    if (!t) kiln_err_prefix(err, errlen, "%s: ", path);
    return t;
}

struct kiln_tokenizer *tok_load(const char *model_dir, char *err, size_t errlen) {
    if (kiln_gguf_is_file(model_dir)) return tok_load_gguf(model_dir, err, errlen);
    char *path = kiln_path_join(model_dir, "tokenizer.json");
    struct kiln_file f; /* mapped, not read: no copy, and far fewer page faults */
    if (kiln_file_map(&f, path, err, errlen)) {
        free(path);
        return NULL;
    }
    struct kiln_tokenizer *t = tok_load_json((const char *)f.data, f.size, err, errlen);
    kiln_file_unmap(&f);
    if (!t) kiln_err_prefix(err, errlen, "%s: ", path);
    free(path);
    if (t && load_config(t, model_dir, err, errlen)) {
        tok_free(t);
        return NULL;
    }
    return t;
}

void tok_free(struct kiln_tokenizer *t) {
    if (!t) return;
    tok_strmap_free(&t->vocab);
    free(t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    free(t->pre);
    free(t->id_off);
    free(t->id_bytes);
    free(t->id_special);
    if (t->cache)
        for (uint32_t i = 0; i < TOK_CACHE_SLOTS; i++) free(t->cache[i].blob);
    free(t->cache);
    for (int i = 0; i < TOK_CACHE_LOCKS; i++) pthread_mutex_destroy(&t->cache_lock[i]);
    free(t->eos_token);
    free(t->bos_token);
    free(t->pad_token);
    free(t->chat_template);
    free(t);
}

int tok_vocab_size(const struct kiln_tokenizer *t) { return t->n_vocab; }
const char *tok_eos_token(const struct kiln_tokenizer *t) { return t->eos_token; }
const char *tok_bos_token(const struct kiln_tokenizer *t) { return t->bos_token; }
const char *tok_pad_token(const struct kiln_tokenizer *t) { return t->pad_token; }
int tok_add_bos_token(const struct kiln_tokenizer *t) { return t->add_bos_token; }
const char *tok_chat_template(const struct kiln_tokenizer *t) { return t->chat_template; }

int tok_is_special(const struct kiln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->id_special[id];
}

int tok_token_id(const struct kiln_tokenizer *t, const char *token_text) {
    size_t n = strlen(token_text);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token_text, n)) return t->added[i].id;
    uint8_t *b;
    size_t bl;
    if (tok_bytelevel_to_bytes(token_text, n, &b, &bl)) {
        free(b);
        return -1;
    }
    int32_t id = tok_strmap_get(&t->vocab, b, bl);
    free(b);
    return id;
}

const uint8_t *tok_id_bytes(const struct kiln_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = t->id_off[id + 1] - t->id_off[id];
    return t->id_bytes + t->id_off[id];
}
