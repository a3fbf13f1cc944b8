// tokenizer.h: byte-level BPE as GPT-2, LLaMA-3 and Qwen use it, loaded from
// and written to Hugging Face `tokenizer.json` files.
//
// Math/algorithm source: Sennrich et al. 2016 (BPE merges by rank), Radford et
// al. 2019 (GPT-2 byte-to-unicode map and pre-tokenizer regex); the reference
// implementation it must match is Hugging Face `tokenizers` (BPE model,
// ByteLevel pre-tokenizer and decoder).
#ifndef TRIDENT_TOKENIZER_H
#define TRIDENT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/common.h"

struct tokenizer;

// Loads a tokenizer.json (BPE model with ByteLevel pre-tokenizer; the GPT-2 or
// LLaMA-3 split pattern; merges; added and special tokens; the normalizers,
// post-processors and decoders listed in tokenizer.c).
// Errors: STATUS_BAD_INPUT naming the file and the field when the file is
// missing, not JSON, not a byte-level BPE, or uses a field or value trident
// does not apply exactly as HF does (the message names field and value).
enum status tokenizer_load(const char *path, struct tokenizer **out, struct error *err);
void tokenizer_free(struct tokenizer *tok);

// Encodes len bytes of text (any bytes; invalid UTF-8 is encoded byte-wise) to
// token ids, as HF encode(text, add_special_tokens=False). *ids is malloc'd
// (caller frees), *n_ids its length. Added tokens written literally in text are
// matched as HF does; those with special=true only when allow_special is 1
// (HF's default), else their text is encoded as ordinary text (HF
// encode_special_tokens=True): document text in a corpus must not forge an
// end-of-text id. Errors: none for valid tokenizers (returns STATUS_OK).
enum status tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, int allow_special,
                             int32_t **ids, size_t *n_ids, struct error *err);

// Decodes ids to bytes; *text is malloc'd and NUL-terminated, *len excludes the
// NUL. decode(encode(x)) == x for every byte string x.
// Errors: STATUS_BAD_INPUT for an id outside [0, vocab size).
enum status tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n_ids,
                             char **text, size_t *len, struct error *err);

// Copies n bytes of decoded text with every invalid UTF-8 sequence (a byte
// that starts no valid code point: a stray continuation byte, a truncated or
// overlong sequence, a surrogate, > U+10FFFF) replaced by U+FFFD, one per
// invalid byte, and so is each C0 control byte but tab and newline (NUL,
// ESC, CR ... : terminal escapes, grep's binary test), so that a log that
// prints it stays text (grep, editors).
// Validity per utf8proc_iterate (Unicode §3.9, Table 3-7). Returns a
// malloc'd NUL-terminated string; *out_len (may be NULL) excludes the NUL.
char *tokenizer_utf8_sanitize(const char *text, size_t n, size_t *out_len);
// The same with control bytes kept: only invalid UTF-8 becomes U+FFFD (text
// for a JSON string, whose writer escapes the controls).
char *tokenizer_utf8_repair(const char *text, size_t n, size_t *out_len);

// Number of ids (base vocabulary plus added tokens): max id + 1.
int tokenizer_vocab_size(const struct tokenizer *tok);
// The id of the end-of-text token ("<|endoftext|>", "<|end_of_text|>" or "</s>"),
// or -1 when the tokenizer has none.
int tokenizer_eot_id(const struct tokenizer *tok);
// A short identity of the tokenizer for index.ini and checkpoints: a hex digest
// of its vocabulary and merges (stable across loads of the same file).
const char *tokenizer_identity(const struct tokenizer *tok);
// The identity of dir/tokenizer.json (a Hugging Face folder's, or one kept
// next to a checkpoint) into out (n bytes, n >= 33), or "" when dir holds no
// tokenizer.json. Errors: tokenizer_load's, naming the file.
enum status tokenizer_folder_identity(const char *dir, char *out, size_t n, struct error *err);

// Trains a byte-level BPE with vocab_size ids (256 byte tokens, merges, and the
// special token "<|endoftext|>" as the last id) on n_docs documents and writes
// a tokenizer.json that Hugging Face tokenizers loads and encodes identically.
// Errors: STATUS_BAD_INPUT when vocab_size < 257; STATUS_RUNTIME on I/O errors
// naming out_path.
enum status tokenizer_train(const char *const *docs, const size_t *doc_lens, size_t n_docs,
                            int vocab_size, const char *out_path, struct error *err);

#endif
