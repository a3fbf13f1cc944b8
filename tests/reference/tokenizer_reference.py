#!/usr/bin/env python3
"""Reference fixtures for trident's byte-level BPE tokenizer (src/tokenizer*.c),
made with Hugging Face `tokenizers`.

Writes into tests/reference/fixtures/:
  hf_bpe_tokenizer.json      GPT-2 style: ByteLevel(add_prefix_space=False) pre-tokenizer,
                             trained on tokenizer_corpus.txt, vocab 1000 (999 trained + <|endoftext|>)
  hf_bpe_ids.txt             its ids for tokenizer_test_text.txt
  hf_bpe_prefix_tokenizer.json / hf_bpe_prefix_ids.txt
                             the same model with ByteLevel(add_prefix_space=True)
  hf_llama3_tokenizer.json   LLaMA-3 style: Split(LLaMA-3 regex, Isolated) + ByteLevel(use_regex=False),
                             ignore_merges=True, special tokens <|begin_of_text|> <|end_of_text|>
  hf_llama3_ids.txt          its ids for tokenizer_test_text.txt
  tokenizer_test_text.txt    the test text (ASCII, accents, CJK, emoji with ZWJ, whitespace runs,
                             digits, contractions, special tokens)

hf_bpe_tokenizer.json is trained the way trident's trainer works (special_tokens=[],
the 256-byte alphabet, then <|endoftext|> added as the last id), so trident training on
the same corpus must reproduce its vocab and merges exactly (tests/unit/test_tokenizer.c).

Documents: the corpus split on runs of two or more newlines (as `trident tokenize --train`).
Run: python3 tests/reference/tokenizer_reference.py   (tokenizers 0.23.x used)
"""
import json
import os
import re

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEST_TEXT = (
    "Hello, world! The quick brown fox jumps over the lazy dog.\n"
    "It's Bob's car; they're sure we've seen I'm here, you'll go, he'd know, don't 'T IS IT'S.\n"
    "Café naïve Ångström façade jalapeño Übermäßig Straße.\n"
    "日本語のテキスト、中文文本，한국어 텍스트.\n"
    "Emoji: 😀🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸 👩‍💻!\n"
    "Spaces:  two   three    four     five.\tTab\t\ttwo tabs\n\n\nthree newlines\r\nCRLF\n"
    "Digits 0 7 42 123 1234 12345 3.14159 1,000,000 2024-03-15\n"
    "<|endoftext|>After the special token<|endoftext|><|endoftext|> twice.\n"
    "   leading and trailing   \n"
    "In the beginning God created the heaven and the earth."
)


def corpus_docs():
    with open(os.path.join(FIX, "tokenizer_corpus.txt"), encoding="utf-8") as f:
        text = f.read()
    return [d for d in re.split(r"\n{2,}", text) if d]


def write_ids(name, tok, text):
    ids = tok.encode(text).ids
    with open(os.path.join(FIX, name), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    return ids


def train_gpt2_style(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=999, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    assert tok.get_vocab_size() == 1000 and tok.token_to_id("<|endoftext|>") == 999
    return tok


def train_llama3_style(docs):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1100, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    # <|endoftext|> in the test text is plain text to this tokenizer.
    return tok


def main():
    docs = corpus_docs()
    with open(os.path.join(FIX, "tokenizer_test_text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(TEST_TEXT)

    gpt2 = train_gpt2_style(docs)
    gpt2.save(os.path.join(FIX, "hf_bpe_tokenizer.json"))
    ids = write_ids("hf_bpe_ids.txt", gpt2, TEST_TEXT)
    assert gpt2.decode(ids, skip_special_tokens=False) == TEST_TEXT

    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    gpt2.save(os.path.join(FIX, "hf_bpe_prefix_tokenizer.json"))
    write_ids("hf_bpe_prefix_ids.txt", gpt2, TEST_TEXT)

    llama = train_llama3_style(docs)
    path = os.path.join(FIX, "hf_llama3_tokenizer.json")
    llama.save(path)
    with open(path) as f:
        assert json.load(f)["model"]["ignore_merges"] is True
    ids = write_ids("hf_llama3_ids.txt", llama, TEST_TEXT)
    assert llama.decode(ids, skip_special_tokens=False) == TEST_TEXT
    print(f"docs {len(docs)}, gpt2 vocab {gpt2.get_vocab_size()}, llama3 vocab {llama.get_vocab_size()}, "
          f"test ids {len(ids)}")


if __name__ == "__main__":
    main()
