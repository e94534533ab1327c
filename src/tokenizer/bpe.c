/*
 * bpe.c: encode and decode with a loaded tokenizer (load.c builds it).
 *
 * Encode follows HF tokenizers' pipeline for encode(text, add_special_tokens=False):
 *   1. invalid UTF-8 is repaired first (see tok_encode);
 *   2. added tokens with normalized=false are split out of the raw text
 *      (leftmost-longest, then single_word / lstrip / rstrip as HF's
 *      AddedVocabulary::find_matches does);
 *   3. each remaining piece is NFC-normalized (if the file asks), and added
 *      tokens with normalized=true are split out of the normalized text;
 *   4. the pre-tokenizer steps split it into words (Split regex Isolated,
 *      ByteLevel with optional prefix space and GPT-2 regex, Digits);
 *   5. each word is BPE-merged by rank, lowest rank first and leftmost on
 *      ties (HF's Word::merge_all with a min-heap).
 * Words' ids are cached in a direct-mapped table shared by all threads
 * (sharded mutexes; a collision simply replaces the slot).
 *
 * Decode concatenates each id's bytes (byte-level decoded at load) and
 * repairs invalid UTF-8 like Rust's String::from_utf8_lossy.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, localtime_r, strncasecmp */
#endif
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/base.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

/* ==== UTF-8 ==== */

/* Length of the valid prefix of the sequence at s (1..4 when complete),
 * following the Unicode table of well-formed sequences. *need gets the full
 * length the lead byte announces (0 for an invalid lead). */
static int utf8_valid_prefix(const uint8_t *s, size_t n, int *need) {
    uint8_t c = s[0];
    uint8_t lo = 0x80, hi = 0xBF;
    int len;
    if (c < 0x80) return *need = 1, 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return *need = 0, 0;
    *need = len;
    int k = 1;
    for (; k < len && (size_t)k < n; k++) {
        uint8_t lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (s[k] < lo_k || s[k] > hi_k) break;
    }
    return k;
}

static void buf_put(char **out, size_t *len, size_t *cap, const void *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        *out = kiln_realloc(*out, c);
        *cap = c;
    }
    memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = 0;
}

size_t tok_utf8_repair(const uint8_t *s, size_t n, int final, char **out, size_t *out_len, size_t *cap) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the current stretch of valid bytes */
    buf_put(out, out_len, cap, "", 0);
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int need, k = utf8_valid_prefix(s + i, n - i, &need);
        if (need && k == need) {
            i += (size_t)k;
            continue;
        }
        buf_put(out, out_len, cap, s + run, i - run);
        if (need && i + (size_t)k == n && !final) return i; /* incomplete tail: hold back */
        buf_put(out, out_len, cap, fffd, 3);
        i += k ? (size_t)k : 1;
        run = i;
    }
    buf_put(out, out_len, cap, s + run, n - run);
    return n;
}

static int utf8_is_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int need, k = utf8_valid_prefix(s + i, n - i, &need);
        if (!need || k != need) return 0;
        i += (size_t)k;
    }
    return 1;
}

static int32_t utf8_decode(const uint8_t *s, size_t n, int *len) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    if (l <= 0) return *len = 1, -1;
    return *len = (int)l, cp;
}

/* Rust's char::is_whitespace (the Unicode White_Space property) */
static int is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Rust's char::is_alphanumeric (Alphabetic or Numeric; categories approximate
 * Alphabetic by L* and Nl, Numeric by Nd, Nl, No) */
static int is_alnum_cp(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static int is_numeric_cp(int32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* the last codepoint before s+n (n > 0) */
static int32_t utf8_last(const uint8_t *s, size_t n, size_t *start) {
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80 && n - i < 4) i--;
    int l;
    *start = i;
    return utf8_decode(s + i, n - i, &l);
}

/* ==== the encoder state of one call ==== */

struct enc {
    const struct kiln_tokenizer *t;
    int32_t *ids;
    int n, cap;
    pcre2_match_data *md;
    char *err;
    size_t errlen;
    int failed;
};

static void emit(struct enc *e, int32_t id) {
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->ids = kiln_realloc(e->ids, (size_t)e->cap * sizeof *e->ids);
    }
    e->ids[e->n++] = id;
}

/* ==== BPE on one word ==== */

static uint64_t hash64(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

static const struct tok_merge_slot *merge_get(const struct kiln_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = (uint32_t)(h >> 32) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        if (t->merges[i].key == key) return &t->merges[i];
        if (!t->merges[i].key) return NULL;
    }
}

struct cand {
    int32_t rank, pos, left, right, id;
};

static int cand_less(const struct cand *a, const struct cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct cand *h, int *n, struct cand c) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, int *n) {
    struct cand top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const struct cand *mc = &last;
        if (l < *n && cand_less(&h[l], mc)) m = l, mc = &h[l];
        if (r < *n && cand_less(&h[r], mc)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const struct kiln_tokenizer *t, struct cand *h, int *nh, const int32_t *id, int pos, int nxt) {
    const struct tok_merge_slot *m = merge_get(t, id[pos], id[nxt]);
    if (m) heap_push(h, nh, (struct cand){m->rank, pos, id[pos], id[nxt], m->id});
}

/* merges the bytes of one word into ids appended to e */
static void bpe_merge(struct enc *e, const uint8_t *s, size_t n) {
    const struct kiln_tokenizer *t = e->t;
    int32_t sid[256], sprev[256], snext[256];
    struct cand sheap[768];
    int32_t *id = sid, *prev = sprev, *next = snext;
    struct cand *heap = sheap;
    if (n > 256) {
        id = kiln_malloc(n * 3 * sizeof *id);
        prev = id + n, next = prev + n;
        heap = kiln_malloc(n * 3 * sizeof *heap);
    }
    int m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) id[m++] = t->byte_id[s[i]]; /* no unk: HF drops it */
    for (int i = 0; i < m; i++) prev[i] = i - 1, next[i] = i + 1 < m ? i + 1 : -1;
    int nh = 0;
    for (int i = 0; i + 1 < m; i++) try_pair(t, heap, &nh, id, i, i + 1);
    while (nh) {
        struct cand c = heap_pop(heap, &nh);
        int j = next[c.pos];
        if (id[c.pos] < 0 || j < 0 || id[c.pos] != c.left || id[j] != c.right) continue;
        id[c.pos] = c.id;
        id[j] = -1;
        next[c.pos] = next[j];
        if (next[j] >= 0) prev[next[j]] = c.pos;
        if (prev[c.pos] >= 0) try_pair(t, heap, &nh, id, prev[c.pos], c.pos);
        if (next[c.pos] >= 0) try_pair(t, heap, &nh, id, c.pos, next[c.pos]);
    }
    for (int i = m ? 0 : -1; i >= 0; i = next[i]) emit(e, id[i]);
    if (id != sid) free(id), free(heap);
}

static void bpe_word(struct enc *e, const uint8_t *s, size_t n) {
    const struct kiln_tokenizer *t = e->t;
    if (!n) return;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, s, n);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    if (n == 1 && t->byte_id[s[0]] >= 0) {
        emit(e, t->byte_id[s[0]]);
        return;
    }
    if (n > TOK_CACHE_MAX_WORD) {
        bpe_merge(e, s, n);
        return;
    }
    uint64_t h = hash64(s, n);
    uint32_t slot = (uint32_t)h & (TOK_CACHE_SLOTS - 1);
    pthread_mutex_t *lock = (pthread_mutex_t *)&t->cache_lock[slot % TOK_CACHE_LOCKS];
    struct tok_cache_slot *c = &t->cache[slot];
    pthread_mutex_lock(lock);
    if (c->blob && c->hash == h && c->klen == n && !memcmp(c->blob, s, n)) {
        for (uint32_t i = 0; i < c->n_ids; i++) {
            int32_t id;
            memcpy(&id, c->blob + n + 4 * i, 4);
            emit(e, id);
        }
        pthread_mutex_unlock(lock);
        return;
    }
    pthread_mutex_unlock(lock);
    int first = e->n;
    bpe_merge(e, s, n);
    uint32_t k = (uint32_t)(e->n - first);
    uint8_t *blob = kiln_malloc(n + 4 * (size_t)k);
    memcpy(blob, s, n);
    memcpy(blob + n, e->ids + first, 4 * (size_t)k);
    pthread_mutex_lock(lock);
    free(c->blob);
    c->blob = blob, c->hash = h, c->klen = (uint32_t)n, c->n_ids = k;
    pthread_mutex_unlock(lock);
}

/* ==== pre-tokenizers ==== */

static void pretok(struct enc *e, int step, const uint8_t *s, size_t n);

static int regex_next(struct enc *e, pcre2_code *re, const uint8_t *s, size_t n, size_t off, size_t *ms, size_t *me) {
    int rc = pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK, e->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter uses the heap */
        rc = pcre2_match(re, s, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(rc, msg, sizeof msg);
        if (!e->failed) kiln_errf(e->err, e->errlen, "pre_tokenizer regex: %s", (char *)msg);
        e->failed = 1;
        return 0;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    *ms = ov[0], *me = ov[1];
    return 1;
}

/* Split with behavior Isolated: every match and every gap is a piece */
static void split_regex(struct enc *e, int step, pcre2_code *re, const uint8_t *s, size_t n) {
    size_t off = 0, last = 0, ms, me;
    while (off <= n && regex_next(e, re, s, n, off, &ms, &me)) {
        if (me == ms) { /* empty match: step over one character */
            if (ms >= n) break;
            int l;
            utf8_decode(s + ms, n - ms, &l);
            off = ms + (size_t)l;
            continue;
        }
        if (ms > last) pretok(e, step + 1, s + last, ms - last);
        pretok(e, step + 1, s + ms, me - ms);
        last = off = me;
    }
    if (last < n) pretok(e, step + 1, s + last, n - last);
}

static void split_digits(struct enc *e, int step, int individual, const uint8_t *s, size_t n) {
    size_t i = 0, start = 0;
    int run_num = -1;
    while (i < n) {
        int l;
        int num = is_numeric_cp(utf8_decode(s + i, n - i, &l));
        if (run_num >= 0 && (num != run_num || (num && individual))) {
            pretok(e, step + 1, s + start, i - start);
            start = i;
        }
        run_num = num;
        i += (size_t)l;
    }
    if (start < n) pretok(e, step + 1, s + start, n - start);
}

static void pretok(struct enc *e, int step, const uint8_t *s, size_t n) {
    const struct kiln_tokenizer *t = e->t;
    if (!n || e->failed) return;
    if (step == t->n_pre) {
        bpe_word(e, s, n);
        return;
    }
    const struct tok_pre *p = &t->pre[step];
    switch (p->type) {
    case TOK_PRE_SPLIT: split_regex(e, step, p->re, s, n); return;
    case TOK_PRE_DIGITS: split_digits(e, step, p->individual_digits, s, n); return;
    case TOK_PRE_BYTELEVEL: {
        uint8_t *tmp = NULL;
        if (p->add_prefix_space && s[0] != ' ') {
            tmp = kiln_malloc(n + 1);
            tmp[0] = ' ';
            memcpy(tmp + 1, s, n);
            s = tmp, n++;
        }
        if (p->re) split_regex(e, step, p->re, s, n);
        else pretok(e, step + 1, s, n);
        free(tmp);
        return;
    }
    }
}

/* ==== normalization ==== */

/* True when NFC cannot change s: every codepoint is below U+0300 (no
 * decompositions, nothing combines with it) or a CJK unified ideograph. */
static int nfc_stable(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0xCC) { /* lead bytes below 0xCC encode codepoints < U+0300 */
            i++;
            continue;
        }
        int l;
        int32_t c = utf8_decode(s + i, n - i, &l);
        if (!(c >= 0x4E00 && c <= 0x9FFF)) return 0;
        i += (size_t)l;
    }
    return 1;
}

static void split_added(struct enc *e, int normalized, const uint8_t *s, size_t n);

static void normalize_piece(struct enc *e, const uint8_t *s, size_t n) {
    if (!e->t->nfc || nfc_stable(s, n)) {
        split_added(e, 1, s, n);
        return;
    }
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r = utf8proc_map(s, (utf8proc_ssize_t)n, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) { /* cannot happen on repaired UTF-8; encode unnormalized rather than fail */
        split_added(e, 1, s, n);
        return;
    }
    split_added(e, 1, out, (size_t)r);
    free(out);
}

/* ==== added tokens ==== */

static void text_piece(struct enc *e, int normalized, const uint8_t *s, size_t n) {
    if (!n) return;
    if (normalized) pretok(e, 0, s, n);
    else normalize_piece(e, s, n);
}

/* Splits out the added tokens of one kind (normalized 0: matched on the raw
 * text; 1: on the normalized text), as AddedVocabulary::find_matches. */
static void split_added(struct enc *e, int normalized, const uint8_t *s, size_t n) {
    const struct kiln_tokenizer *t = e->t;
    const uint8_t *first = t->added_first[normalized];
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        if (!first[s[pos]]) {
            pos++;
            continue;
        }
        const struct tok_added *a = NULL;
        for (int i = 0; i < t->n_added; i++) {
            const struct tok_added *c = &t->added[i];
            if (c->normalized == normalized && c->len <= n - pos && (uint8_t)c->content[0] == s[pos] &&
                !memcmp(c->content, s + pos, c->len)) {
                a = c;
                break;
            }
        }
        if (!a) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + a->len;
        pos = stop;
        if (a->single_word) {
            size_t st;
            int l;
            int before = start > 0 && is_alnum_cp(utf8_last(s, start, &st));
            int after = stop < n && is_alnum_cp(utf8_decode(s + stop, n - stop, &l));
            if (before || after) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t st;
                if (!is_ws(utf8_last(s, ns, &st))) break;
                ns = st;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                if (!is_ws(utf8_decode(s + stop, n - stop, &l))) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start) text_piece(e, normalized, s + start_offset, start - start_offset);
        emit(e, a->id);
        start_offset = stop;
    }
    if (start_offset < n) text_piece(e, normalized, s + start_offset, n - start_offset);
}

/* ==== public ==== */

int tok_encode(const struct kiln_tokenizer *t, const char *text, size_t len, int32_t **ids, int *n_ids,
               char *err, size_t errlen) {
    struct enc e = {.t = t, .err = err, .errlen = errlen};
    *ids = NULL, *n_ids = 0;
    const uint8_t *s = (const uint8_t *)text;
    char *fixed = NULL;
    if (!utf8_is_valid(s, len)) {
        /* HF receives a Python str: bytes that are not UTF-8 reach it as
         * bytes.decode("utf-8", errors="replace") would give them, one U+FFFD
         * per maximal invalid subpart. Do the same instead of failing. */
        size_t fl = 0, cap = 0;
        tok_utf8_repair(s, len, 1, &fixed, &fl, &cap);
        s = (const uint8_t *)fixed, len = fl;
    }
    e.md = pcre2_match_data_create(1, NULL);
    if (!e.md) {
        free(fixed);
        return kiln_errf(err, errlen, "out of memory for regex match data");
    }
    split_added(&e, 0, s, len);
    pcre2_match_data_free(e.md);
    free(fixed);
    if (e.failed) {
        free(e.ids);
        return -1;
    }
    *ids = e.ids, *n_ids = e.n;
    return 0;
}

char *tok_decode(const struct kiln_tokenizer *t, const int32_t *ids, int n_ids, int skip_special, size_t *len,
                 char *err, size_t errlen) {
    char *raw = NULL, *out = NULL;
    size_t rl = 0, rcap = 0, ol = 0, ocap = 0;
    buf_put(&raw, &rl, &rcap, "", 0);
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            free(raw);
            kiln_errf(err, errlen, "token id %d out of range (vocab size %d)", (int)ids[i], t->n_vocab);
            return NULL;
        }
        if (skip_special && t->id_special[ids[i]]) continue;
        size_t bl;
        const uint8_t *b = tok_id_bytes(t, ids[i], &bl);
        buf_put(&raw, &rl, &rcap, b, bl);
    }
    tok_utf8_repair((const uint8_t *)raw, rl, 1, &out, &ol, &ocap);
    free(raw);
    if (len) *len = ol;
    return out;
}
