// loader_state.h: the position of a data loader (src/data/loader.c) as a plain
// record: the loader fills and restores it (loader_state_save, _load,
// data/dataset.h), a checkpoint stores it (src/ckpt/). Here, below both, so
// that the checkpoint layer does not include data/ (docs/design.md §1, §7).
#ifndef TRIDENT_LOADER_STATE_H
#define TRIDENT_LOADER_STATE_H

#include <stdint.h>

// Most datasets one loader blends ([data] paths).
#define LOADER_MAX_DATASETS 32

// Loader position, saved into checkpoints, counted in samples (sequences), not
// batches, so that a run may resume with another global_batch_size (it
// continues at the next unconsumed sample) and, at a step boundary (micro ==
// 0), on another dp or micro_batch_size.
//  - One dataset: epoch and sample = the position in that epoch's permutation
//    of the first sample of the next global batch.
//  - Blend (n_datasets > 1): epoch = 0 and sample = mixture samples consumed
//    (whole run); counts[d] = dataset d's samples consumed, so its next
//    sample is position counts[d] % n_d of its epoch counts[d] / n_d.
// global_batch_size is the saving run's (for the resume message);
// seq_len, n_datasets, sequences and weights describe the data the state
// belongs to: loader_state_load refuses another seed, seq_len or dataset
// list. format 1: a checkpoint written before samples (sample holds the batch
// index; seq_len and n_datasets 0: unknown); 2: this layout.
struct loader_state {
    uint64_t format;
    uint64_t seed;
    uint64_t epoch;
    uint64_t sample;
    uint64_t micro; // microbatches of the current global batch served here
    uint64_t seq_len;
    uint64_t n_datasets;
    uint64_t global_batch_size; // of the run that saved it (0: unknown, format 1)
    uint64_t counts[LOADER_MAX_DATASETS];    // blend: samples consumed per dataset
    uint64_t sequences[LOADER_MAX_DATASETS]; // each dataset's split sequence count
    double weights[LOADER_MAX_DATASETS];     // normalised blend weights (1 alone)
};

#endif
