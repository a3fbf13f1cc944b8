// llama_fixture.h: the model config of a LLaMA reference fixture
// (tests/reference/llama_reference.py writes it as root attributes of
// llama_tiny_untied.h5 / llama_tiny_tied.h5), shared by the tests that read it.
#ifndef TRIDENT_TESTS_LLAMA_FIXTURE_H
#define TRIDENT_TESTS_LLAMA_FIXTURE_H

#include "h5fixture.h"
#include "model/model.h"

// The llama_config of fixture file f (vocab_size, d_model, n_layers, n_heads,
// n_kv_heads, ffn_dim, max_seq_len, rope_theta, norm_eps, tie_embeddings;
// init_std 0.02, unused: the weights come from the file). Exits 1 through
// h5fixture_fail when an attribute is missing.
static inline struct llama_config llama_fixture_config(hid_t f) {
    return (struct llama_config){
        .vocab_size = (int)h5fixture_attr_f64(f, "/", "vocab_size"),
        .d_model = (int)h5fixture_attr_f64(f, "/", "d_model"),
        .n_layers = (int)h5fixture_attr_f64(f, "/", "n_layers"),
        .n_heads = (int)h5fixture_attr_f64(f, "/", "n_heads"),
        .n_kv_heads = (int)h5fixture_attr_f64(f, "/", "n_kv_heads"),
        .ffn_dim = (int)h5fixture_attr_f64(f, "/", "ffn_dim"),
        .max_seq_len = (int)h5fixture_attr_f64(f, "/", "max_seq_len"),
        .rope_theta = h5fixture_attr_f64(f, "/", "rope_theta"),
        .norm_eps = (float)h5fixture_attr_f64(f, "/", "norm_eps"),
        .tie_embeddings = h5fixture_attr_f64(f, "/", "tie_embeddings") != 0,
        .init_std = 0.02f,
    };
}

#endif
