/*
 * safetensors.h: read-only, mmap-backed access to the tensors of one
 * checkpoint (one file or many shards, with or without
 * model.safetensors.index.json). Tensor data is never copied: st_tensor.data
 * points into the mapping, valid until st_close.
 *
 * Layout of a file:
 *
 *   +----------+---------------------------+-----------------------------+
 *   | u64 N LE | N bytes of JSON header    | data (offsets relative here) |
 *   +----------+---------------------------+-----------------------------+
 *   header: {"__metadata__": {...}, "name": {"dtype": "BF16",
 *            "shape": [a, b], "data_offsets": [begin, end]}, ...}
 *
 * Everything is validated at open: header length within the file, JSON
 * shape, known dtypes, offsets in range, end-begin equal to the shape's bytes,
 * no two tensors overlapping, no name twice. Later code may trust shapes.
 */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "format/dtype.h"

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    enum kiln_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data; /* into the file mapping */
    size_t nbytes;
    int file; /* index into st_set.files */
};

struct st_set {
    int n_files;
    struct kiln_file *files;
    int n;
    struct st_tensor *t; /* sorted by name */
};

/* Parses one file's header and appends its tensors to s (file index `file`).
 * `data`/`size` is the whole file. Used by st_open and by the fuzz target. */
int st_parse_file(struct st_set *s, int file, const uint8_t *data, size_t size, const char *fname, char *err,
                  size_t errlen);

/* Opens every shard of the checkpoint in dir: the files named by
 * model.safetensors.index.json when it exists (and every tensor it lists must
 * be found in the file it names), else every *.safetensors in dir. */
int st_open_dir(struct st_set *s, const char *dir, char *err, size_t errlen);

/* The tensor called name, or NULL. */
const struct st_tensor *st_find(const struct st_set *s, const char *name);

/* Sorts the tensors and rejects duplicate names. Called by st_open_dir. */
int st_finish(struct st_set *s, char *err, size_t errlen);

void st_close(struct st_set *s);

#endif
