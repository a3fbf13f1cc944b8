// dataset_writer.c: write a dataset folder (shards, then index.ini last).
#include "dataset.h"

#include "base/checksum.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

enum status dataset_writer_init(struct dataset_writer *w, const char *dir, int64_t vocab_size, int64_t eot_id,
                                const char *tokenizer, struct error *err) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return error_set(err, STATUS_RUNTIME, "%s: cannot create folder: %s", dir, strerror(errno));
    char path[4200];
    snprintf(path, sizeof path, "%s/index.ini", dir);
    struct stat st;
    if (stat(path, &st) == 0)
        return error_set(err, STATUS_BAD_INPUT, "%s: already holds a dataset; remove it or choose another --output",
                         path);
    w->meta.vocab_size = vocab_size;
    w->meta.eot_id = eot_id;
    w->meta.format_version = SHARD_FORMAT_VERSION;
    snprintf(w->meta.tokenizer, sizeof w->meta.tokenizer, "%s", tokenizer);
    w->index.format_version = SHARD_FORMAT_VERSION;
    w->index.vocab_size = vocab_size;
    w->index.eot_id = eot_id;
    snprintf(w->index.tokenizer, sizeof w->index.tokenizer, "%s", tokenizer);
    snprintf(w->index.splits, sizeof w->index.splits, "train val");
    return STATUS_OK;
}

enum status dataset_writer_add(struct dataset_writer *w, enum split split, const int32_t *tokens, uint64_t n_tokens,
                               const uint64_t *doc_offsets, uint64_t n_docs, struct error *err) {
    return dataset_writer_add_masked(w, split, tokens, NULL, n_tokens, doc_offsets, n_docs, err);
}

enum status dataset_writer_add_masked(struct dataset_writer *w, enum split split, const int32_t *tokens,
                                      const uint8_t *loss_mask, uint64_t n_tokens, const uint64_t *doc_offsets,
                                      uint64_t n_docs, struct error *err) {
    struct index_shard e = {.split = split, .tokens = n_tokens, .documents = n_docs};
    snprintf(e.file, sizeof e.file, "shard-%05d.h5", w->index.n_shards);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", w->dir, e.file);
    enum status s = shard_write_masked(path, w->force_elem_bytes, tokens, loss_mask, n_tokens, doc_offsets, n_docs,
                                       &w->meta, err);
    if (s) return s;
    struct stat st;
    if (stat(path, &st) != 0) return error_set(err, STATUS_RUNTIME, "%s: vanished after writing", path);
    e.bytes = (uint64_t)st.st_size;
    if ((s = checksum_file(path, e.checksum, err))) return s;
    index_add_shard(&w->index, &e);
    w->index.total_tokens += n_tokens;
    return STATUS_OK;
}

enum status dataset_writer_finish(struct dataset_writer *w, struct error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/index.ini", w->dir);
    w->index.num_shards = w->index.n_shards;
    enum status s = index_write(path, &w->index, err);
    index_free(&w->index);
    return s;
}
