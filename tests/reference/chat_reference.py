#!/usr/bin/env python3
"""Reference fixtures for trident's chat templates (src/data/chat.c) and the
tokenizer.json files of the Llama 3.x and Qwen2/2.5/3 families (src/tokenizer),
made with Hugging Face `tokenizers` and transformers' apply_chat_template.

Real tokenizer files cannot be downloaded here; these have the same structure,
trained small on tokenizer_corpus.txt plus the conversations below:
  chat_llama3_tokenizer.json  Llama 3.x: BPE ignore_merges=true, Split(Llama 3 regex,
                              Isolated) + ByteLevel(use_regex=false), post-processor
                              ByteLevel + TemplateProcessing(<|begin_of_text|> $A), special
                              tokens after the trained ids: <|begin_of_text|> <|end_of_text|>
                              <|reserved_special_token_0|> <|start_header_id|>
                              <|end_header_id|> <|eot_id|>
  chat_qwen2_tokenizer.json   Qwen2/2.5/3: NFC normalizer, Split(Qwen2 regex: single digits)
                              + ByteLevel(trim_offsets=false, use_regex=false), ignore_merges
                              false, continuing_subword_prefix "" / end_of_word_suffix "", added
                              tokens <|endoftext|> <|im_start|> <|im_end|> (special) and
                              <tool_call> </tool_call> (not special)
  chat_unicode_text.txt       a varied Unicode text (scripts, combining marks, NFC-changing
                              sequences, emoji, digits, whitespace runs, special-token text)
  chat_llama3_unicode_ids.txt / chat_qwen2_unicode_ids.txt
                              tokenizers' ids for it (encode, add_special_tokens=False)
  chat_conversations.jsonl    20 conversations (system prompts in 16, 2 to 6 turns, Unicode)
  chat_llama3_expected.jsonl / chat_chatml_expected.jsonl
                              per conversation: "ids" = apply_chat_template(tokenize=True) with
                              the upstream template (Llama 3.1 Instruct's; Qwen2.5 Instruct's for
                              the 16 with a system message, plain ChatML for the 4 without),
                              "mask" = 1 on the tokens of assistant contents and their end token
                              (from the tokens' character offsets), "prompt_ids" = the
                              conversation up to its last user message with
                              add_generation_prompt=True.

Run: .venv-hf/bin/python tests/reference/chat_reference.py  (transformers 4.46.3, tokenizers 0.20.3)
"""
import json
import os
import re

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json "chat_template" (as published).
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Qwen/Qwen2.5-7B-Instruct tokenizer_config.json "chat_template" (as published).
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# The generic ChatML template (Qwen2.5's without its default system prompt).
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")

UNICODE_TEXT = (
    "Hello, world! It's Bob's car; they're sure we've seen I'm here, you'll go, he'd know. DON'T 'T IS IT'S\n"
    "Café naïve Ångström façade jalapeño Übermäßig Straße — «quotes» „Anführung“ ‘single’\n"
    "Decomposed: cafe\u0301 A\u030angstro\u0308m e\u0301te\u0301 \u212b \u2126 \u1e9b\u0323 (NFC changes these)\n"
    "Ελληνικά κείμενα, русский текст, עברית, العربية والأرقام ١٢٣٤٥, हिन्दी पाठ, ไทย, ქართული\n"
    "日本語のテキスト、中文文本，한국어 텍스트。全角ＡＢＣ１２３ and ｶﾀｶﾅ\n"
    "Emoji: 😀🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸 👩‍💻! ©®™ ∑∫√∞≠≤ ½ ⅓ x² H₂O\n"
    "Digits 0 7 42 123 1234 12345 3.14159 1,000,000 2024-03-15 0x1F ٣٤ ４５６\n"
    "Spaces:  two   three    four\u00a0nbsp\u3000ideographic\u2003em\tTab\t\ttabs\n\n\nnewlines\r\nCRLF\r\n"
    "   leading and trailing   \n"
    "code: def f(x): return x**2 + 1  # comment\n    if a != b and c >= d: pass\n"
    "special text <|eot_id|> <|im_end|> <|begin_of_text|> <tool_call>x</tool_call> stays text here\n"
    "end"
)

SYSTEMS = [
    "You are a helpful assistant.",
    "  Answer briefly, in the user's language.\n",
    "Tu es un assistant serviable qui répond en français.",
    "あなたは親切なアシスタントです。",
    "You are a pirate 🏴‍☠️. Speak like one!",
    "Reply with JSON only: {\"answer\": ...}",
    "Σύντομες απαντήσεις, παρακαλώ.",
    "You summarize texts.\n\nRules:\n1. Be short.\n2. Be exact.",
]
TURNS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Translate 'good morning' to German.", "Guten Morgen!"),
    ("¿Cuántos días tiene una semana?", "Una semana tiene 7 días."),
    ("2 + 2 = ?", "4"),
    ("Write a haiku about the sea.", "Waves fold into foam,\nsalt wind carries gull voices—\nthe tide keeps its time."),
    ("東京の人口は？", "東京都の人口は約1400万人です。"),
    ("Say hi in Korean", "안녕하세요! 👋"),
    ("  padded question  ", "  padded answer with trailing newline\n"),
    ("Give me a list.", "- one\n- two\n- three"),
    ("Explain e=mc².", "Energy equals mass times the speed of light squared: E = mc²."),
    ("Naïve café façade?", "Déjà vu: cafe\u0301 in NFD."),
    ("Code please", "```python\ndef add(a, b):\n    return a + b\n```"),
    ("Count to 12345", "1 2 3 ... 12345"),
    ("Quote something", "«Le cœur a ses raisons que la raison ne connaît point.»"),
    ("Emoji story", "🐱‍👤 met 🐶 and they 🍕 together 🎉"),
    ("Arabic?", "مرحبا بالعالم ١٢٣"),
    ("Empty reply next", ""),
    ("tabs\tand\ttabs", "ok\tdone"),
]


def conversations():
    """20 conversations: 16 with a system prompt, 2 to 6 turns (user/assistant pairs,
    one ending in a second system message), varied Unicode."""
    convs = []
    for c in range(20):
        msgs = []
        if c < 16:
            msgs.append({"role": "system", "content": SYSTEMS[c % len(SYSTEMS)]})
        n_turns = 1 + c % 4
        for t in range(n_turns):
            u, a = TURNS[(3 * c + t) % len(TURNS)]
            msgs.append({"role": "user", "content": u})
            msgs.append({"role": "assistant", "content": a})
        if c == 7:  # a later system message
            msgs.insert(3, {"role": "system", "content": "Now answer in one word."})
        convs.append(msgs)
    return convs


def corpus_docs():
    with open(os.path.join(FIX, "tokenizer_corpus.txt"), encoding="utf-8") as f:
        text = f.read()
    docs = [d for d in re.split(r"\n{2,}", text) if d]
    docs += [UNICODE_TEXT] * 3
    for conv in conversations():
        docs += [m["content"] for m in conv] * 2
    return docs


def special(s):
    return AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)


def llama3_tokenizer(docs):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.add_special_tokens([special(s) for s in ["<|begin_of_text|>", "<|end_of_text|>",
                                                 "<|reserved_special_token_0|>", "<|start_header_id|>",
                                                 "<|end_header_id|>", "<|eot_id|>"]])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return tok


def qwen2_tokenizer(docs):
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=[], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.add_special_tokens([special(s) for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken(s, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False)
                    for s in ["<tool_call>", "</tool_call>"]])
    return tok


def save(tok, name, patch=None):
    path = os.path.join(FIX, name)
    tok.save(path)
    if patch:
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        patch(tj)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=2)
    return path


def qwen_fields(tj):
    # as Qwen2's files write them
    tj["model"]["continuing_subword_prefix"] = ""
    tj["model"]["end_of_word_suffix"] = ""


def expected(path, template_for, family, convs):
    """ids, mask and generation-prompt ids of each conversation."""
    # the special tokens as the families' tokenizer_config.json name them (the
    # Llama 3.1 template starts with bos_token)
    hf = PreTrainedTokenizerFast(tokenizer_file=path, **(
        dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>") if family == "llama3"
        else dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")))
    fast = Tokenizer.from_file(path)
    end = "<|eot_id|>" if family == "llama3" else "<|im_end|>"
    rows = []
    for conv in convs:
        tmpl = template_for(conv)
        text = hf.apply_chat_template(conv, chat_template=tmpl, tokenize=False)
        ids = hf.apply_chat_template(conv, chat_template=tmpl, tokenize=True)
        enc = fast.encode(text, add_special_tokens=False)
        assert enc.ids == ids, "tokenizer encode != apply_chat_template ids"
        # character ranges trained on: each assistant content and its end token
        spans, at = [], 0
        for m in conv:
            c = m["content"].strip() if family == "llama3" else m["content"]
            if m["role"] != "assistant":
                continue
            head = ("<|start_header_id|>assistant<|end_header_id|>\n\n" if family == "llama3"
                    else "<|im_start|>assistant\n")
            k = text.index(head + c + end, at) + len(head)
            spans.append((k, k + len(c) + len(end)))
            at = k
        mask = [int(any(a < e and b > s for s, e in spans)) for a, b in enc.offsets]
        last_user = max(i for i, m in enumerate(conv) if m["role"] == "user")
        prompt_ids = hf.apply_chat_template(conv[:last_user + 1], chat_template=tmpl, tokenize=True,
                                            add_generation_prompt=True)
        rows.append({"ids": ids, "mask": mask, "prompt_ids": prompt_ids})
    return rows


def main():
    convs = conversations()
    docs = corpus_docs()
    with open(os.path.join(FIX, "chat_unicode_text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(UNICODE_TEXT)
    with open(os.path.join(FIX, "chat_conversations.jsonl"), "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")

    lp = save(llama3_tokenizer(docs), "chat_llama3_tokenizer.json")
    qp = save(qwen2_tokenizer(docs), "chat_qwen2_tokenizer.json", qwen_fields)
    for p, name in ((lp, "chat_llama3_unicode_ids.txt"), (qp, "chat_qwen2_unicode_ids.txt")):
        tok = Tokenizer.from_file(p)
        ids = tok.encode(UNICODE_TEXT, add_special_tokens=False).ids
        with open(os.path.join(FIX, name), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        print(f"{name}: {len(ids)} ids, vocab {tok.get_vocab_size()}")

    for family, path, tf in (("llama3", lp, lambda c: LLAMA31_TEMPLATE),
                             ("chatml", qp, lambda c: QWEN25_TEMPLATE if c[0]["role"] == "system" else CHATML_TEMPLATE)):
        rows = expected(path, tf, "llama3" if family == "llama3" else "chatml", convs)
        with open(os.path.join(FIX, f"chat_{family}_expected.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"chat_{family}_expected.jsonl: {len(rows)} conversations, {sum(len(r['ids']) for r in rows)} ids, "
              f"{sum(sum(r['mask']) for r in rows)} trained")


if __name__ == "__main__":
    main()
