// chat.h: conversations rendered with a chat template as data, not a Jinja
// engine (`prep --format chat --chat-template`, `generate --chat`, the
// export's tokenizer_config.json "chat_template"; docs/formats.md, "Chat").
//
// Templates (the text each renders; c = the content, c|trim = Python's
// str.strip() of it, as Jinja's trim filter):
//   plain   trident's own: "System: c", "User: c", "Assistant: c" joined by
//           "\n"; generation prompt "\nAssistant:" (prep.h: segments of
//           PREP_CHAT_SEP, kept as it was).
//   llama3  Llama 3.1 Instruct's template (meta-llama/Llama-3.1-8B-Instruct's
//           tokenizer_config.json) without tools: "<|begin_of_text|>", then a
//           system header always: "<|start_header_id|>system<|end_header_id|>
//           \n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024
//           \n\n" + the first message's c|trim when its role is system +
//           "<|eot_id|>"; then each other message "<|start_header_id|>" + role +
//           "<|end_header_id|>\n\n" + c|trim + "<|eot_id|>"; generation prompt
//           "<|start_header_id|>assistant<|end_header_id|>\n\n". The date is
//           the template's default date_string (Llama 3.2's template puts
//           today's date there instead: not matched).
//   chatml  ChatML as Qwen2.5 writes it: each message "<|im_start|>" + role +
//           "\n" + c + "<|im_end|>\n"; generation prompt "<|im_start|>
//           assistant\n". Equal to Qwen2.5-Instruct's template for every
//           conversation that starts with a system message and has no tools
//           (without one, Qwen2.5's adds its own default system prompt).
// Loss mask (llama3, chatml): 1 on each assistant message's content and its
// end token (<|eot_id|>, <|im_end|>), 0 elsewhere (headers, the "\n" after
// <|im_end|>, other roles). Token ids are those of HF's encode of the whole
// rendered text with add_special_tokens=False (apply_chat_template's), the
// template's markers as their special ids; contents are encoded with the
// caller's allow_special (HF parses special-token text inside contents too:
// the same ids only when allow_special is 1). A token that straddles the
// boundary between a header and a trained content is trained on.
#ifndef TRIDENT_CHAT_H
#define TRIDENT_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "base/common.h"
#include "tokenizer/tokenizer.h"

enum chat_template { CHAT_TEMPLATE_PLAIN = 0, CHAT_TEMPLATE_LLAMA3, CHAT_TEMPLATE_CHATML, CHAT_TEMPLATE_COUNT };

// "plain", "llama3", "chatml".
const char *chat_template_name(enum chat_template t);
// The template named s, or -1.
int chat_template_parse(const char *s);
// The template as a Jinja string for tokenizer_config.json "chat_template":
// transformers' apply_chat_template renders with it exactly what the C code
// renders (llama3: "<|begin_of_text|>" written out, not bos_token).
const char *chat_template_jinja(enum chat_template t);
// The special token that ends a turn ("<|eot_id|>", "<|im_end|>"), NULL for plain.
const char *chat_template_end_token(enum chat_template t);

// Checks tok has every special token template t writes, each encoding to one
// id. Errors: STATUS_BAD_INPUT naming the template and the missing token.
enum status chat_template_check(const struct tokenizer *tok, enum chat_template t, struct error *err);

// A rendered conversation (llama3, chatml): pieces, each a tag byte
// (CHAT_PIECE_TRAIN | CHAT_PIECE_SPECIAL), its length as 4 bytes little-endian
// and its bytes.
#define CHAT_PIECE_TRAIN 1
#define CHAT_PIECE_SPECIAL 2
struct chat_msg {
    const char *role, *content;
    size_t role_len, content_len;
};
// Appends the pieces of messages m (n) rendered with t (llama3 or chatml) to
// *buf (*len bytes, *cap allocated; realloc'd), with the generation prompt
// when add_generation_prompt. Errors: STATUS_BAD_INPUT for a role other than
// system, user or assistant (the message's index in the text).
enum status chat_render(enum chat_template t, const struct chat_msg *m, size_t n, int add_generation_prompt,
                        char **buf, size_t *len, size_t *cap, struct error *err);

// Encodes rendered pieces (len bytes): *ids (*n,) and *mask (*n,), malloc'd.
// Text between two special pieces is encoded as one text (allow_special as
// tokenizer_encode), so ids equal HF's on the whole string. Errors:
// STATUS_BAD_INPUT when a special piece is not one id of tok.
enum status chat_encode(const struct tokenizer *tok, const char *pieces, size_t len, int allow_special,
                        int32_t **ids, uint8_t **mask, size_t *n, struct error *err);

#endif
