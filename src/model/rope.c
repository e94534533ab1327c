/*
 * rope.c: the rotary frequencies, computed as transformers'
 * ROPE_INIT_FUNCTIONS compute them (default, linear, llama3, yarn), in f32
 * where transformers uses f32 so that angles match to the last bit or so.
 */
#include <math.h>

#include "base/base.h"
#include "model/model.h"

/* transformers: base ** (arange(0, dim, 2).float() / dim), then 1 / that */
static float base_inv_freq(double base, int i, int dim) {
    float e = (float)(2 * i) / (float)dim;
    return 1.0f / (float)pow(base, (double)e);
}

static double yarn_mscale(double scale) { return scale <= 1 ? 1.0 : 0.1 * log(scale) + 1.0; }

static double yarn_corr_dim(double n_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rot * 2 * M_PI))) / (2 * log(base));
}

void rope_init(struct rope *r, const struct kiln_config *c);
void rope_init(struct rope *r, const struct kiln_config *c) {
    const struct kiln_rope_cfg *rc = &c->rope;
    int dim = c->head_dim, n = dim / 2;
    r->n_freq = n;
    r->inv_freq = kiln_malloc(sizeof(float) * (size_t)n);
    r->attn_factor = 1.0f;
    for (int i = 0; i < n; i++) r->inv_freq[i] = base_inv_freq(rc->theta, i, dim);
    switch (rc->type) {
    case KILN_ROPE_DEFAULT: break;
    case KILN_ROPE_LINEAR:
        for (int i = 0; i < n; i++) r->inv_freq[i] /= (float)rc->factor;
        break;
    case KILN_ROPE_LLAMA3: {
        double lo_wl = rc->original_max_pos / rc->low_freq_factor, hi_wl = rc->original_max_pos / rc->high_freq_factor;
        for (int i = 0; i < n; i++) {
            float f = r->inv_freq[i];
            double wl = 2 * M_PI / f;
            if (wl > lo_wl) {
                f = f / (float)rc->factor;
            } else if (wl >= hi_wl) { /* medium band: smooth between the two */
                double s = (rc->original_max_pos / wl - rc->low_freq_factor) / (rc->high_freq_factor - rc->low_freq_factor);
                f = (float)((1 - s) * f / rc->factor + s * f);
            }
            r->inv_freq[i] = f;
        }
        break;
    }
    case KILN_ROPE_YARN: {
        double lo = yarn_corr_dim(rc->beta_fast, dim, rc->theta, rc->original_max_pos);
        double hi = yarn_corr_dim(rc->beta_slow, dim, rc->theta, rc->original_max_pos);
        if (rc->truncate) lo = floor(lo), hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < n; i++) {
            float pos_freq = (float)pow(rc->theta, (double)((float)(2 * i) / (float)dim));
            float extra = 1.0f / pos_freq, inter = 1.0f / ((float)rc->factor * pos_freq);
            float ramp = (float)((i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp; /* extrapolation weight */
            r->inv_freq[i] = inter * (1 - ef) + extra * ef;
        }
        r->attn_factor = (float)(rc->attention_factor > 0 ? rc->attention_factor : yarn_mscale(rc->factor));
        break;
    }
    }
}
