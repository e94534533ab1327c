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
 * - cJSON parses the 11 MB Qwen3 file in about 50 ms; the maps are sized once
 *   from the element counts, so the whole load stays well under 150 ms.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, localtime_r, strncasecmp */
#endif
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ==== byte-level alphabet ==== */

uint16_t tok_byte_to_cp[256];
static int16_t cp_to_byte_tab[324];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void) {
    /* GPT-2: printable Latin-1 bytes keep their codepoint, the others are
     * numbered 256, 257, ... in byte order */
    int n = 0;
    for (int i = 0; i < 324; i++) cp_to_byte_tab[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        tok_byte_to_cp[b] = (uint16_t)(keep ? b : 256 + n++);
        cp_to_byte_tab[tok_byte_to_cp[b]] = (int16_t)b;
    }
}

void tok_bytelevel_init(void) { pthread_once(&bytelevel_once, bytelevel_build); }

int tok_cp_to_byte(int32_t cp) { return cp >= 0 && cp < 324 ? cp_to_byte_tab[cp] : -1; }

int tok_bytelevel_to_bytes(const char *s, size_t n, uint8_t **out, size_t *out_len) {
    uint8_t *o = kiln_malloc(n + 1);
    size_t k = 0;
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int len;
        uint8_t c = p[i];
        if (c < 0x80) cp = c, len = 1;
        else if ((c & 0xE0) == 0xC0 && i + 1 < n) cp = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F), len = 2;
        else cp = -1, len = 1;
        int b = tok_cp_to_byte(cp);
        if (b < 0) { /* outside the alphabet: keep the UTF-8 as is */
            memcpy(o, s, n);
            *out = o, *out_len = n;
            return -1;
        }
        o[k++] = (uint8_t)b;
        i += (size_t)len;
    }
    *out = o, *out_len = k;
    return 0;
}

/* ==== hash maps ==== */

uint32_t tok_hash_bytes(const uint8_t *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static void strmap_init(struct tok_strmap *m, uint32_t n_expected) {
    uint32_t cap = 64;
    while (cap < n_expected * 2) cap <<= 1;
    m->slots = kiln_calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->n = 0;
    m->cap_keys = n_expected > 16 ? n_expected : 16;
    m->keys = kiln_malloc(m->cap_keys * sizeof *m->keys);
    m->arena_cap = (size_t)m->cap_keys * 8;
    m->arena = kiln_malloc(m->arena_cap);
    m->arena_len = 0;
}

static uint32_t strmap_find(const struct tok_strmap *m, const uint8_t *s, size_t n, uint32_t h) {
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t k = m->slots[i];
        if (!k) return i;
        k--;
        if (m->keys[k].hash == h && m->keys[k].len == n && !memcmp(m->arena + m->keys[k].off, s, n))
            return i;
    }
}

/* Inserts or overwrites. The map never grows: strmap_init sized it. */
int tok_strmap_put(struct tok_strmap *m, const uint8_t *s, size_t n, int32_t id) {
    uint32_t h = tok_hash_bytes(s, n);
    uint32_t i = strmap_find(m, s, n, h);
    if (m->slots[i]) {
        m->keys[m->slots[i] - 1].id = id;
        return 0;
    }
    if (m->n * 2 >= m->mask) return -1;
    if (m->n == m->cap_keys) {
        m->cap_keys *= 2;
        m->keys = kiln_realloc(m->keys, m->cap_keys * sizeof *m->keys);
    }
    while (m->arena_len + n > m->arena_cap) {
        m->arena_cap *= 2;
        m->arena = kiln_realloc(m->arena, m->arena_cap);
    }
    memcpy(m->arena + m->arena_len, s, n);
    m->keys[m->n].off = (uint32_t)m->arena_len;
    m->keys[m->n].len = (uint32_t)n;
    m->keys[m->n].id = id;
    m->keys[m->n].hash = h;
    m->arena_len += n;
    m->slots[i] = ++m->n;
    return 0;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const uint8_t *s, size_t n) {
    if (!m->slots) return -1;
    uint32_t i = strmap_find(m, s, n, tok_hash_bytes(s, n));
    return m->slots[i] ? m->keys[m->slots[i] - 1].id : -1;
}

void tok_strmap_free(struct tok_strmap *m) {
    free(m->slots);
    free(m->keys);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static int merge_put(struct kiln_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 32) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        if (t->merges[i].key == key) return 0; /* a repeated merge keeps its first rank, as HF */
        if (!t->merges[i].key) {
            t->merges[i].key = key, t->merges[i].rank = rank, t->merges[i].id = id;
            return 0;
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

static int load_model(struct kiln_tokenizer *t, const cJSON *m, char *err, size_t errlen) {
    if (!cJSON_IsObject(m)) return kiln_errf(err, errlen, "tokenizer.json has no model object");
    const char *type = json_str(m, "type");
    if (type && strcmp(type, "BPE"))
        return kiln_errf(err, errlen, "unsupported tokenizer model type '%s' (only BPE)", type);
    const char *pfx = json_str(m, "continuing_subword_prefix"), *sfx = json_str(m, "end_of_word_suffix");
    if ((pfx && *pfx) || (sfx && *sfx))
        return kiln_errf(err, errlen, "BPE with continuing_subword_prefix/end_of_word_suffix is not supported");
    if (json_bool(m, "byte_fallback", 0)) return kiln_errf(err, errlen, "BPE with byte_fallback is not supported");
    t->ignore_merges = json_bool(m, "ignore_merges", 0);

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsObject(vocab)) return kiln_errf(err, errlen, "model.vocab missing or not an object");
    if (!cJSON_IsArray(merges)) return kiln_errf(err, errlen, "model.merges missing or not an array");

    int nv = cJSON_GetArraySize(vocab);
    strmap_init(&t->vocab, (uint32_t)nv + 1);
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 0x7fffffff)
            return kiln_errf(err, errlen, "model.vocab['%.40s']: id is not a non-negative integer", it->string);
        uint8_t *b;
        size_t bl;
        tok_bytelevel_to_bytes(it->string, strlen(it->string), &b, &bl);
        tok_strmap_put(&t->vocab, b, bl, it->valueint);
        free(b);
        if (it->valueint >= t->n_vocab) t->n_vocab = it->valueint + 1;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_strmap_get(&t->vocab, &c, 1);
    }

    int nm = cJSON_GetArraySize(merges);
    uint32_t cap = 64;
    while (cap < (uint32_t)nm * 2) cap <<= 1;
    t->merges = kiln_calloc(cap, sizeof *t->merges);
    t->merges_mask = cap - 1;
    int rank = 0;
    uint8_t *buf = NULL;
    size_t bufcap = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(it)) { /* "a b" */
            a = it->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) return kiln_errf(err, errlen, "merge %d ('%.60s') is not two tokens", rank, a);
            al = (size_t)(sp - a), b = sp + 1, bl = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) { /* ["a", "b"] */
            a = it->child->valuestring, al = strlen(a);
            b = it->child->next->valuestring, bl = strlen(b);
        } else {
            return kiln_errf(err, errlen, "merge %d is neither \"a b\" nor [a, b]", rank);
        }
        uint8_t *ab, *bb;
        size_t abl, bbl;
        tok_bytelevel_to_bytes(a, al, &ab, &abl);
        tok_bytelevel_to_bytes(b, bl, &bb, &bbl);
        if (abl + bbl > bufcap) bufcap = (abl + bbl) * 2, buf = kiln_realloc(buf, bufcap);
        memcpy(buf, ab, abl);
        memcpy(buf + abl, bb, bbl);
        int32_t ia = tok_strmap_get(&t->vocab, ab, abl), ib = tok_strmap_get(&t->vocab, bb, bbl);
        int32_t im = tok_strmap_get(&t->vocab, buf, abl + bbl);
        free(ab);
        free(bb);
        if (ia < 0 || ib < 0 || im < 0) {
            free(buf);
            return kiln_errf(err, errlen, "merge %d ('%.*s' + '%.*s'): token not in vocab", rank, (int)al, a, (int)bl, b);
        }
        merge_put(t, ia, ib, rank, im);
        rank++;
    }
    free(buf);
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
    const uint8_t **src = kiln_calloc((size_t)t->n_vocab, sizeof *src);
    uint32_t *len = kiln_calloc((size_t)t->n_vocab, sizeof *len);
    uint8_t **owned = kiln_calloc((size_t)t->n_added + 1, sizeof *owned);
    for (uint32_t k = 0; k < t->vocab.n; k++) {
        int32_t id = t->vocab.keys[k].id;
        src[id] = t->vocab.arena + t->vocab.keys[k].off, len[id] = t->vocab.keys[k].len;
    }
    t->id_special = kiln_calloc((size_t)t->n_vocab, 1);
    for (int i = 0; i < t->n_added; i++) {
        size_t bl;
        tok_bytelevel_to_bytes(t->added[i].content, t->added[i].len, &owned[i], &bl);
        src[t->added[i].id] = owned[i], len[t->added[i].id] = (uint32_t)bl;
        t->id_special[t->added[i].id] = t->added[i].special;
    }
    t->id_off = kiln_malloc(((size_t)t->n_vocab + 1) * sizeof *t->id_off);
    t->id_bytes = kiln_malloc(total + 1);
    uint32_t off = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        t->id_off[id] = off;
        if (src[id]) memcpy(t->id_bytes + off, src[id], len[id]), off += len[id];
    }
    t->id_off[t->n_vocab] = off;
    for (int i = 0; i < t->n_added; i++) free(owned[i]);
    free(owned);
    free(src);
    free(len);
}

struct kiln_tokenizer *tok_load_json(const char *json, size_t len, char *err, size_t errlen) {
    tok_bytelevel_init();
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        const char *where = cJSON_GetErrorPtr();
        kiln_errf(err, errlen, "tokenizer.json is not valid JSON (near byte %ld)",
                  where && where >= json && where <= json + len ? (long)(where - json) : -1L);
        cJSON_Delete(root);
        return NULL;
    }
    struct kiln_tokenizer *t = kiln_calloc(1, sizeof *t);
    for (int i = 0; i < TOK_CACHE_LOCKS; i++) pthread_mutex_init(&t->cache_lock[i], NULL);
    if (load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), err, errlen) ||
        load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen) ||
        load_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen) ||
        load_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), err, errlen) ||
        load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err, errlen)) {
        cJSON_Delete(root);
        tok_free(t);
        return NULL;
    }
    cJSON_Delete(root);
    build_decode_table(t);
    t->cache = kiln_calloc(TOK_CACHE_SLOTS, sizeof *t->cache);
    return t;
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

struct kiln_tokenizer *tok_load(const char *model_dir, char *err, size_t errlen) {
    char *path = kiln_path_join(model_dir, "tokenizer.json");
    size_t n;
    char *text = kiln_read_file(path, &n, err, errlen);
    if (!text) {
        free(path);
        return NULL;
    }
    struct kiln_tokenizer *t = tok_load_json(text, n, err, errlen);
    free(text);
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
