/*
 * engine_internal.h: struct kiln_engine, for the engine's own files (the
 * serving loop in serve_engine.c needs the model and the KV pool). Nothing
 * outside src/engine/ includes this; front-ends see only kiln.h.
 */
#ifndef KILN_ENGINE_INTERNAL_H
#define KILN_ENGINE_INTERNAL_H

#include "engine/kv.h"
#include "kiln.h"
#include "model/model.h"

struct kiln_engine {
    struct kiln_backend *be;
    struct kiln_model model;
    struct kv_pool kv;
    int prefill_chunk; /* most prompt tokens per forward */
    int max_tokens;    /* KV pool capacity in tokens (pages * page_size) */
};

#endif
