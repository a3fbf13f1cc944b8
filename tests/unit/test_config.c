// test_config.c: the config module: defaults, configs/tiny.ini, overrides,
// sizes, comments, print -> load round trip, the generated docs, the docs/design.md
// §10 key contract, and a table of bad configs that must each fail with exit
// status 2 and a message naming where, which key, the value and the expectation.
// `test_config --write-docs` regenerates docs/config.md from the key table.
#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config/config.h"
#include "train/plan.h"
#include "test.h"

static char tmp_path[64];

static void write_tmp(const char *text) {
    FILE *f = fopen(tmp_path, "w");
    if (!f) {
        perror(tmp_path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static bool contains(const char *s, const char *frag) { return strstr(s, frag) != NULL; }

// frag with each '@' replaced by the temp file's path.
static void expand(const char *frag, char *out, size_t n) {
    size_t len = 0;
    for (const char *p = frag; *p && len + 1 < n; p++) {
        if (*p == '@') len += (size_t)snprintf(out + len, n - len, "%s", tmp_path);
        else out[len++] = *p;
    }
    out[MIN(len, n - 1)] = '\0';
}

// ---- the docs/design.md §10 contract ----------------------------------------------

static void test_contract_keys(void) {
    static const char *required[] = {
        "model.arch", "model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads",
        "model.n_kv_heads", "model.ffn_dim", "model.max_seq_len", "model.rope_theta", "model.norm_eps",
        "model.tie_embeddings", "model.init_std", "model.recompute", "train.seq_len", "train.micro_batch_size",
        "train.global_batch_size", "train.steps", "train.lr", "train.min_lr", "train.warmup_steps",
        "train.lr_schedule", "train.weight_decay", "train.beta1", "train.beta2", "train.adam_eps",
        "train.grad_clip", "train.label_smoothing", "train.seed", "train.eval_every", "train.eval_steps",
        "train.sample_every", "data.path", "data.tokenizer", "data.cache_dir", "data.cache_bytes",
        "data.prefetch_shards", "parallel.tp", "parallel.pp", "parallel.dp", "parallel.dp_shard", "parallel.virtual_stages",
        "parallel.sequence_parallel", "parallel.zero_stage", "parallel.bucket_mb", "precision.dtype",
        "precision.loss_scale", "checkpoint.dir", "checkpoint.every", "checkpoint.keep_last",
        "checkpoint.resume", "log.every", "log.metrics_file", "log.run_dir", "system.device",
        "system.attention", "system.threads", "system.peak_tflops", "system.watchdog_s"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        char sec[32];
        const char *dot = strchr(required[i], '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - required[i]), required[i]);
        EXPECT(config_key_index(sec, dot + 1) >= 0, "docs/design.md §10 key %s is missing", required[i]);
    }
}

// ---- parallel.dp = 0: inferred from the world size ------------------------------

// A config of defaults with overrides (section.key=value ...), validated on world ranks.
static enum status load_on(int world, struct config *c, struct error *err, int n, const char **over) {
    enum status st = config_load(NULL, n, (char **)over, c, err);
    return st ? st : config_validate(c, world, false, err);
}

static void test_dp_inference(void) {
    struct config c;
    struct error err = {0};
    // micro 2, global 16: tp 2 on 4 ranks -> dp 2 (2 microbatches each); the
    // expected dp is computed here as world / (tp * pp), not read back.
    const char *tp2[] = {"parallel.tp=2", "model.n_heads=8", "train.micro_batch_size=2", "train.global_batch_size=16"};
    EXPECT(load_on(4, &c, &err, 4, tp2) == STATUS_OK && c.parallel.dp == 4 / (2 * 1), "tp 2 on 4 ranks: dp %d (%s)",
           c.parallel.dp, err.msg);
    const char *pp2[] = {"parallel.tp=2", "parallel.pp=2", "train.micro_batch_size=2", "train.global_batch_size=16"};
    EXPECT(load_on(8, &c, &err, 4, pp2) == STATUS_OK && c.parallel.dp == 8 / (2 * 2), "tp 2 pp 2 on 8 ranks: dp %d (%s)",
           c.parallel.dp, err.msg);
    EXPECT(load_on(1, &c, &err, 0, NULL) == STATUS_OK && c.parallel.dp == 1, "defaults on 1 rank: dp %d", c.parallel.dp);
    // A dp that is set is kept, and checked against the world as before.
    const char *set3[] = {"parallel.dp=3", "train.micro_batch_size=1", "train.global_batch_size=3"};
    EXPECT(load_on(4, &c, &err, 3, set3) == STATUS_BAD_INPUT && contains(err.msg, "sizes must multiply to the number of ranks"),
           "explicit dp 3 on 4 ranks: %s", err.msg);
    // 6 ranks with tp * pp = 4: the world sizes around it that work.
    EXPECT(load_on(6, &c, &err, 4, pp2) == STATUS_BAD_INPUT && contains(err.msg, "N = 6 ranks") &&
               contains(err.msg, "tp * cp * pp = 4") && contains(err.msg, "run on 4 or 8 ranks"),
           "6 ranks, tp * pp = 4: %s", err.msg);
    // tp 2 on 6 ranks: dp 3; global 16, micro 2 -> 16 % 6: nearest 12 and 18,
    // or 4 or 8 ranks (dp 2 or 4 divide 16 / 2 = 8).
    EXPECT(load_on(6, &c, &err, 4, tp2) == STATUS_BAD_INPUT && contains(err.msg, "infers dp = 6 ranks / (tp 2 * cp 1 * pp 1) = 3") &&
               contains(err.msg, "global_batch_size = 12 or 18") && contains(err.msg, "4 or 8 ranks (dp = 2 or 4)"),
           "global 16 on dp 3: %s", err.msg);
    // No world (trident plan without --world-size): dp = 0 means 1.
    config_defaults(&c);
    EXPECT(config_resolve_dp(&c, 0, &err) == STATUS_OK && c.parallel.dp == 1, "no world: dp %d", c.parallel.dp);
}

// ---- defaults, tiny.ini, overrides ---------------------------------------------

static void test_defaults(void) {
    struct config c;
    config_defaults(&c);
    EXPECT(c.model.arch == MODEL_ARCH_LLAMA && c.model.d_model == 256 && c.model.n_kv_heads == 4, "model defaults");
    EXPECT(c.model.norm_eps == 1e-5 && c.model.tie_embeddings && c.model.recompute == RECOMPUTE_NONE, "model");
    EXPECT(c.train.lr == 3e-4 && c.train.min_lr == 3e-5 && c.train.steps == 1000, "train defaults");
    EXPECT(c.train.lr_schedule == LR_SCHEDULE_COSINE && c.train.seed == 1234 && c.train.beta2 == 0.95, "train");
    EXPECT(!strcmp(c.data.path, "data/kjv-shards") && c.data.tokenizer[0] == '\0', "data paths");
    EXPECT(c.data.cache_bytes == 4LL << 30, "cache_bytes default 4G = %lld", (long long)c.data.cache_bytes);
    EXPECT(c.parallel.tp == 1 && c.parallel.pp == 1 && c.parallel.dp == 0 && !c.parallel.sequence_parallel, "par");
    EXPECT(c.precision.dtype == DTYPE_FP32 && c.precision.loss_scale_mode == LOSS_SCALE_DYNAMIC &&
               c.precision.loss_scale == 0, "precision defaults");
    EXPECT(c.checkpoint.resume == RESUME_AUTO && c.checkpoint.resume_path[0] == '\0', "resume default");
    EXPECT(c.system.device == DEVICE_CPU && c.system.watchdog_s == 300 && c.system.attention == ATTENTION_AUTO,
           "system defaults");
    for (int i = 0; i < config_n_keys; i++) EXPECT(c.origin[i] == 0, "origin of key %d", i);
    struct error err = {0};
    EXPECT(config_validate(&c, 1, false, &err) == STATUS_OK, "defaults validate: %s", err.msg);
}

// The line of tiny.ini whose text starts with prefix, counted independently.
static int line_of(const char *path, const char *prefix) {
    FILE *f = fopen(path, "r");
    char buf[512];
    int line = 0, found = -1;
    while (f && fgets(buf, sizeof buf, f)) {
        line++;
        if (!strncmp(buf, prefix, strlen(prefix)) && found < 0) found = line;
    }
    if (f) fclose(f);
    return found;
}

static void test_tiny(void) {
    struct config c;
    struct error err = {0};
    EXPECT(config_load("configs/tiny.ini", 0, NULL, &c, &err) == STATUS_OK, "tiny.ini loads: %s", err.msg);
    EXPECT(config_validate(&c, 2, false, &err) == STATUS_OK, "tiny.ini validates on 2 ranks: %s", err.msg);
    EXPECT(c.model.vocab_size == 4096 && c.model.ffn_dim == 704 && c.model.norm_eps == 1e-5, "tiny model");
    EXPECT(c.train.lr == 3e-3 && c.train.min_lr == 3e-4 && c.train.steps == 300 && c.train.warmup_steps == 30,
           "tiny train");
    EXPECT(c.train.global_batch_size == 16, "inline comment stripped: %d", c.train.global_batch_size);
    EXPECT(c.parallel.dp == 2 && !strcmp(c.data.path, "data/kjv-shards"), "tiny parallel, data");
    int lr = config_key_index("train", "lr");
    EXPECT(c.origin[lr] == line_of("configs/tiny.ini", "lr ="), "origin of train.lr: line %d", c.origin[lr]);
    char buf[600];
    EXPECT(!strcmp(config_origin(&c, config_key_index("data", "cache_bytes"), buf, sizeof buf), "default"),
           "unset key origin: %s", buf);
    EXPECT(config_validate(&c, 1, false, &err) == STATUS_BAD_INPUT, "tiny.ini on 1 rank must fail");
    for (int s = 0; config_sections[s]; s++) {
        char header[32];
        snprintf(header, sizeof header, "[%s]", config_sections[s]);
        EXPECT(line_of("configs/tiny.ini", header) > 0, "tiny.ini has %s", header);
    }
}

static void test_overrides(void) {
    write_tmp("[train]\nsteps = 300\nlr = 0.001\n[parallel]\ndp = 2\n");
    char *ov[] = {"train.steps=5", "parallel.dp= 1 ", "checkpoint.resume=runs/x/step-000100",
                  "precision.loss_scale=1024"};
    struct config c;
    struct error err = {0};
    EXPECT(config_load(tmp_path, 4, ov, &c, &err) == STATUS_OK, "load with overrides: %s", err.msg);
    EXPECT(c.train.steps == 5, "override wins over the file: steps %d", c.train.steps);
    EXPECT(c.train.lr == 0.001, "file value kept: lr %g", c.train.lr);
    EXPECT(c.parallel.dp == 1, "override value is trimmed: dp %d", c.parallel.dp);
    EXPECT(c.checkpoint.resume == RESUME_PATH && !strcmp(c.checkpoint.resume_path, "runs/x/step-000100"),
           "resume path: %d %s", (int)c.checkpoint.resume, c.checkpoint.resume_path);
    EXPECT(c.precision.loss_scale_mode == LOSS_SCALE_STATIC && c.precision.loss_scale == 1024, "static scale");
    char buf[600];
    int steps = config_key_index("train", "steps");
    EXPECT(!strcmp(config_origin(&c, steps, buf, sizeof buf), "command line argument 1"), "origin %s", buf);
    char *ov2[] = {"checkpoint.resume=none"};
    EXPECT(config_load(NULL, 1, ov2, &c, &err) == STATUS_OK && c.checkpoint.resume == RESUME_NONE, "no file");
}

static void test_sizes_and_comments(void) {
    static const struct {
        const char *text;
        long long bytes;
    } sizes[] = {{"4096", 4096}, {"4K", 4096}, {"4k", 4096}, {"3M", 3LL << 20}, {"2G", 2LL << 30},
                 {"1T", 1LL << 40}, {"1536K", 1536LL << 10}, {"+7", 7}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "[data]\ncache_bytes = %s\n", sizes[i].text);
        write_tmp(text);
        struct config c;
        struct error err = {0};
        EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_OK && c.data.cache_bytes == sizes[i].bytes,
               "size %s -> %lld (%s)", sizes[i].text, (long long)c.data.cache_bytes, err.msg);
    }
    struct config c;
    struct error err = {0};
    write_tmp("# full-line comment\n; another\n\n[train]   # trailing comment on a header\nsteps = 100 # total\n"
              "lr = 0.5 ; semicolon comment\n[data]\npath = data/a#b\ncache_dir = /nvme/cache\t# tab then #\n");
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_OK, "comments: %s", err.msg);
    EXPECT(c.train.steps == 100 && c.train.lr == 0.5, "inline comments stripped: %d %g", c.train.steps, c.train.lr);
    EXPECT(!strcmp(c.data.path, "data/a#b"), "# without whitespace is part of a value: %s", c.data.path);
    EXPECT(!strcmp(c.data.cache_dir, "/nvme/cache"), "tab before #: '%s'", c.data.cache_dir);
    write_tmp("\xEF\xBB\xBF[train]\r\nsteps = 7\r\n");
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_OK && c.train.steps == 7, "BOM, CRLF: %s", err.msg);
}

// ---- round trip -------------------------------------------------------------------

static void test_round_trip(void) {
    char *ov[] = {"train.lr=0.30000000000000004", "train.seed=9007199254740993", "data.cache_bytes=3M",
                  "data.cache_bytes_typo_guard=1"};
    struct config a, b;
    struct error err = {0};
    // The 4th override must fail; load the first three.
    EXPECT(config_load("configs/tiny.ini", 4, ov, &a, &err) == STATUS_BAD_INPUT, "typo override rejected");
    char *ov3[] = {"train.lr=0.30000000000000004", "train.seed=9007199254740993", "data.cache_bytes=3145729",
                   "data.cache_dir=/scratch/c", "precision.loss_scale=65536.5", "checkpoint.resume=ckpt/step-000010",
                   "model.tie_embeddings=0", "train.min_lr=1e-300", NULL};
    char long_dir[340];
    memset(long_dir, 'd', 330);
    long_dir[330] = '\0';
    memcpy(long_dir, "log.run_dir=/", 13);
    ov3[8] = long_dir;
    EXPECT(config_load("configs/tiny.ini", 9, ov3, &a, &err) == STATUS_OK, "load: %s", err.msg);
    char path2[80];
    snprintf(path2, sizeof path2, "%s.printed", tmp_path);
    EXPECT(config_write(&a, "trident 0.1.0 (git abc)\nstarted 2026-01-01T00:00:00Z at step 5; world 4\n",
                        path2, &err) == STATUS_OK, "write: %s", err.msg);
    EXPECT(config_load(path2, 0, NULL, &b, &err) == STATUS_OK, "printed config loads: %s", err.msg);
    char head[64] = "";
    FILE *hf = fopen(path2, "r");
    EXPECT(hf && fgets(head, sizeof head, hf) && !strcmp(head, "# trident 0.1.0 (git abc)\n"),
           "the header is the first lines, as comments: %s", head);
    if (hf) fclose(hf);
    EXPECT(config_equal(&a, &b), "print -> load gives an equal config");
    // Independent of config_equal: the value sections are bytewise equal.
    EXPECT(!memcmp(&a, &b, offsetof(struct config, file)), "print -> load is bytewise equal");
    EXPECT(b.train.lr == 0.30000000000000004 && b.train.seed == 9007199254740993LL && b.train.min_lr == 1e-300,
           "exact doubles and 64-bit ints survive: %.17g %lld", b.train.lr, (long long)b.train.seed);
    EXPECT(b.data.cache_bytes == 3145729 && !b.model.tie_embeddings && b.precision.loss_scale == 65536.5, "b");
    EXPECT(b.data.tokenizer[0] == '\0', "unset path stays unset");
    EXPECT(strlen(b.log.run_dir) == 330 - 12, "a path longer than inih's line survives: %zu", strlen(b.log.run_dir));
    // Defaults round-trip too (unset paths are written as comments).
    config_defaults(&a);
    config_write(&a, NULL, path2, &err);
    EXPECT(config_load(path2, 0, NULL, &b, &err) == STATUS_OK && config_equal(&a, &b), "defaults: %s", err.msg);
    b.train.beta2 = 0.999;
    EXPECT(!config_equal(&a, &b), "config_equal sees a changed value");
    unlink(path2);
    EXPECT(config_write(&a, NULL, "/nonexistent/dir/x.ini", &err) == STATUS_RUNTIME &&
               contains(err.msg, "/nonexistent/dir/x.ini"),
           "write failure names the path: %s", err.msg);
}

// ---- docs ------------------------------------------------------------------------------

// docs/design.md §10's block lists every key of the table and no other: its
// indented lines after "## 10.", "[section]" then key names ("name=..." and
// "(...)" notes allowed), up to the first line that is not indented.
static void test_design_keys(void) {
    FILE *f = fopen("docs/design.md", "r");
    EXPECT(f != NULL, "docs/design.md is missing");
    if (!f) return;
    char line[512], section[32] = "";
    bool in10 = false, started = false;
    int seen[CONFIG_MAX_KEYS] = {0};
    while (fgets(line, sizeof line, f)) {
        if (!in10) {
            in10 = !strncmp(line, "## 10.", 6);
            continue;
        }
        if (strncmp(line, "    ", 4)) {
            if (started) break; // the block ended
            continue;
        }
        started = true;
        for (char *tok = strtok(line, " \t\n"); tok; tok = strtok(NULL, " \t\n")) {
            if (tok[0] == '[') {
                snprintf(section, sizeof section, "%.*s", (int)strcspn(tok + 1, "]"), tok + 1);
                continue;
            }
            if (tok[0] == '(' || strchr(tok, ')')) continue; // a note: "(inferred)", "(= dp)"
            tok[strcspn(tok, "=")] = '\0';
            int i = config_key_index(section, tok);
            EXPECT(i >= 0, "docs/design.md §10 names %s.%s, which the key table lacks", section, tok);
            if (i >= 0) seen[i]++;
        }
    }
    fclose(f);
    EXPECT(started, "docs/design.md has no §10 key block");
    for (int i = 0; i < config_n_keys; i++)
        EXPECT(seen[i] == 1, "docs/design.md §10 lists %s.%s %d times (once expected)",
               config_keys[i].section, config_keys[i].key, seen[i]);
}

static void test_docs(void) {
    test_design_keys();
    char *gen = NULL, *committed = NULL;
    size_t gen_len = 0;
    FILE *m = open_memstream(&gen, &gen_len);
    config_write_docs(m);
    fclose(m);
    FILE *f = fopen("docs/config.md", "r");
    EXPECT(f != NULL, "docs/config.md is missing: run build/tests/test_config --write-docs");
    if (f) {
        committed = calloc(gen_len + 2, 1);
        size_t got = fread(committed, 1, gen_len + 1, f);
        fclose(f);
        EXPECT(got == gen_len && !memcmp(committed, gen, gen_len),
               "docs/config.md differs from the key table: run build/tests/test_config --write-docs");
    }
    for (int i = 0; i < config_n_keys; i++) {
        char row[80];
        snprintf(row, sizeof row, "| `%s` |", config_keys[i].key);
        EXPECT(contains(gen, row), "docs row for %s.%s", config_keys[i].section, config_keys[i].key);
    }
    free(gen);
    free(committed);
}

// ---- bad input ---------------------------------------------------------------------------

struct bad_case {
    const char *name;
    const char *ini;     // written to the temp file; NULL: no file
    const char *ov[3];   // overrides
    int world;           // ranks for config_validate
    const char *frag[5]; // expected in the message; '@' is the temp file's path
};

static const struct bad_case bad_cases[] = {
    {"unknown section", "[modle]\nd_model = 4\n", {0}, 1, {"@:1", "unknown section [modle]", "did you mean [model]?"}},
    {"unknown empty section", "[train]\nsteps = 2\n[foo]\n", {0}, 1, {"@:3", "[foo]", "sections are"}},
    {"unknown key", "[train]\nlrr = 0.1\n", {0}, 1, {"@:2", "'lrr' in [train]", "did you mean train.lr?"}},
    {"key in another section", "[model]\nlr = 0.1\n", {0}, 1, {"@:2", "'lr' in [model]", "did you mean train.lr?"}},
    {"prefix suggestion", "[model]\nvocab = 5\n", {0}, 1, {"@:2", "did you mean model.vocab_size?"}},
    {"upper-case key", "[train]\nLR = 0.1\n", {0}, 1, {"@:2", "'LR' in [train]", "did you mean train.lr?"}},
    {"unknown key no match", "[train]\nzzzzzzz = 1\n", {0}, 1, {"@:2", "keys of [train]:", "seq_len"}},
    {"int not a number", "[model]\nd_model = abc\n", {0}, 1,
     {"@:2", "model.d_model = 'abc'", "not an integer", "expected an integer"}},
    {"float as int", "[model]\nd_model = 256.0\n", {0}, 1, {"@:2", "'256.0'", "trailing text '.0'"}},
    {"float not a number", "[train]\nlr = fast\n", {0}, 1, {"@:2", "train.lr = 'fast'", "expected a number > 0"}},
    {"bool", "[model]\ntie_embeddings = yes\n", {0}, 1,
     {"@:2", "model.tie_embeddings = 'yes'", "true, false, 1 or 0"}},
    {"trailing junk", "[train]\nsteps = 100abc\n", {0}, 1, {"@:2", "train.steps = '100abc'", "trailing text 'abc'"}},
    {"trailing words", "[train]\nsteps = 100 total\n", {0}, 1, {"@:2", "'100 total'", "trailing text ' total'"}},
    {"comment without space", "[train]\nsteps = 100#total\n", {0}, 1,
     {"@:2", "'100#total'", "inline comment needs whitespace"}},
    {"float out of range", "[train]\nbeta1 = 1.0\n", {0}, 1, {"@:2", "train.beta1 = '1.0'", "out of range", "[0, 1)"}},
    {"zero where positive", "[model]\nn_layers = 0\n", {0}, 1,
     {"@:2", "model.n_layers = '0'", "out of range", "[1, 4096]"}},
    {"negative int", "[train]\nwarmup_steps = -5\n", {0}, 1, {"@:2", "train.warmup_steps = '-5'", "out of range"}},
    {"negative size", "[data]\ncache_bytes = -1G\n", {0}, 1, {"@:2", "data.cache_bytes = '-1G'", "negative"}},
    {"bad size suffix", "[data]\ncache_bytes = 4X\n", {0}, 1, {"@:2", "trailing text 'X'", "K, M, G or T suffix"}},
    {"overflow", "[train]\nsteps = 99999999999999999999\n", {0}, 1,
     {"@:2", "train.steps = '99999999999999999999'", "integer overflow"}},
    {"int32 overflow", "[train]\nsteps = 3000000000\n", {0}, 1, {"@:2", "out of range", "[1, 2147483647]"}},
    {"size overflow", "[data]\ncache_bytes = 99999999999T\n", {0}, 1, {"@:2", "integer overflow"}},
    {"float overflow", "[train]\nlr = 1e999\n", {0}, 1, {"@:2", "train.lr = '1e999'", "not a finite"}},
    {"nan", "[train]\nlr = nan\n", {0}, 1, {"@:2", "train.lr = 'nan'", "not a finite"}},
    {"empty value", "[train]\nlr =\n", {0}, 1, {"@:2", "train.lr = ''", "empty value", "expected a number"}},
    {"value only a comment", "[train]\nlr = # later\n", {0}, 1, {"@:2", "empty value"}},
    {"duplicate key", "[train]\nsteps = 1\nlr = 0.1\nsteps = 2\n", {0}, 1,
     {"@:4", "train.steps = '2'", "given twice", "lines 2 and 4"}},
    {"duplicate over two headers", "[train]\nsteps = 1\n[model]\nd_model = 8\n[train]\nsteps = 2\n", {0}, 1,
     {"@:6", "lines 2 and 6"}},
    {"malformed line", "[train]\nsteps 100\n", {0}, 1, {"@:2", "malformed line 'steps 100'", "key = value"}},
    {"colon separator", "[train]\nsteps: 100\n", {0}, 1, {"@:2", "'steps: 100'", "not ':'"}},
    {"no key", "[train]\n= 100\n", {0}, 1, {"@:2", "no key before '='"}},
    {"header without ]", "[train\nsteps = 1\n", {0}, 1, {"@:1", "'[train'", "no closing ']'"}},
    {"text after header", "[train] extra\n", {0}, 1, {"@:1", "'extra'", "after the section header"}},
    {"key before any section", "steps = 1\n", {0}, 1, {"@:1", "'steps'", "before any [section]"}},
    {"indented key", "[train]\nsteps = 1\n  lr = 0.1\n", {0}, 1, {"@:3", "indented line 'lr = 0.1'"}},
    {"quoted path", "[data]\npath = \"data/x\"\n", {0}, 1, {"@:2", "data.path", "not quoted"}},
    {"override without =", NULL, {"train.steps"}, 1, {"command line argument 1 'train.steps'", "section.key=value"}},
    {"override without section", NULL, {"steps=5"}, 1, {"argument 1 'steps=5'", "expected section.key=value"}},
    {"override unknown key", NULL, {"train.stepz=5"}, 1, {"argument 1", "'stepz' in [train]", "did you mean train.steps?"}},
    {"override unknown section", NULL, {"trian.steps=5"}, 1, {"argument 1", "[trian]", "did you mean [train]?"}},
    {"override bad value", NULL, {"train.steps=5", "train.lr=abc"}, 1,
     {"command line argument 2 'train.lr=abc'", "train.lr = 'abc'", "expected a number"}},
    {"override empty value", NULL, {"train.lr="}, 1, {"argument 1", "train.lr = ''", "empty value"}},
    {"override twice", NULL, {"train.lr=0.1", "train.lr=0.2"}, 1, {"train.lr", "arguments 1 and 2"}},
    {"zbv tied zero 3", "[model]\ntie_embeddings = true\n[parallel]\npp = 2\ndp = 2\nvirtual_stages = 2\n"
     "pp_schedule = zbv\nzero_stage = 3\n", {0}, 4,
     {"parallel.pp_schedule = zbv (@:7)", "parallel.zero_stage = 3 (@:8)", "model.tie_embeddings = true (@:2)"}},
    {"unknown device", "[system]\ndevice = tpu\n", {0}, 1, {"@:2", "system.device = 'tpu'", "one of: cpu, cuda"}},
    {"unknown dtype", "[precision]\ndtype = fp8\n", {0}, 1,
     {"@:2", "precision.dtype = 'fp8'", "one of: fp32, bf16, fp16"}},
    {"bad loss scale", "[precision]\nloss_scale = big\n", {0}, 1,
     {"@:2", "precision.loss_scale = 'big'", "dynamic, or a number > 0"}},
    {"negative loss scale", "[precision]\nloss_scale = -8\n", {0}, 1, {"@:2", "'-8'", "out of range"}},
    {"resume typo", "[checkpoint]\nresume = autoo\n", {0}, 1, {"@:2", "checkpoint.resume = 'autoo'", "did you mean auto?"}},
    {"recompute", "[model]\nrecompute = partial\n", {0}, 1, {"@:2", "'partial'", "one of: none, selective, full"}},
    {"cuda in a CPU build", "[system]\ndevice = cuda\n", {0}, 1,
     {"system.device = cuda (@:2)", "this build has no CUDA backend"}},
    {"unknown attention", "[system]\nattention = flash\n", {0}, 1,
     {"@:2", "system.attention = 'flash'", "one of: auto, cudnn, native"}},
    {"cudnn on the cpu", "[system]\nattention = cudnn\n", {0}, 1,
     {"system.attention = cudnn (@:2)", "needs system.device = cuda", "system.device = cpu (default)"}},
    {"tp*pp*dp != ranks", "[parallel]\ntp = 2\ndp = 2\n", {0}, 2,
     {"tp = 2 x cp = 1 x ep = 1 x dp_shard = 2 x dp_replicate = 1 x pp = 1 give 4", "N = 2 ranks", "parallel.tp = 2 (@:2)",
      "parallel.cp = 1 (default); parallel.dp = 2 (@:3); parallel.dp_shard = 0 (default); parallel.ep = 1 (default); parallel.pp = 1 (default)"}},
    {"seq_len % 2 cp", "[train]\nseq_len = 12\n[parallel]\ncp = 4\n", {0}, 4,
     {"seq_len must be a multiple of 2 * cp = 8", "train.seq_len = 12 (@:2)", "parallel.cp = 4 (@:4)"}},
    {"dp_shard must divide dp", "[parallel]\ndp = 4\ndp_shard = 3\n", {0}, 4,
     {"dp_shard must divide dp", "parallel.dp_shard = 3 (@:3)", "parallel.dp = 4 (@:2)"}},
    {"heads % tp", "[model]\nd_model = 192\nn_heads = 6\nn_kv_heads = 2\n[parallel]\ntp = 4\n", {0}, 4,
     {"n_heads must be a multiple of tp", "model.n_heads = 6 (@:3)", "parallel.tp = 4 (@:6)"}},
    {"kv heads vs tp", "[model]\nd_model = 384\nn_heads = 12\nn_kv_heads = 3\n[parallel]\ntp = 4\n", {0}, 4,
     {"n_kv_heads must be a multiple of tp", "model.n_kv_heads = 3 (@:4)", "parallel.tp = 4"}},
    {"heads % kv heads", "[model]\nn_kv_heads = 3\n", {0}, 1, {"multiple of n_kv_heads", "model.n_kv_heads = 3 (@:2)"}},
    {"d_model % heads", "[model]\nd_model = 100\n", {0}, 1, {"d_model must be a multiple of n_heads", "d_model = 100"}},
    {"odd head size", "[model]\nd_model = 24\n", {0}, 1, {"head size d_model / n_heads = 3", "even for RoPE"}},
    {"ffn % tp", "[model]\nffn_dim = 700\n[parallel]\ntp = 8\n", {0}, 8, {"ffn_dim must be a multiple of tp", "700"}},
    // issue 31: the MoE decoder's own rules, and the layouts it does not compose with yet
    {"moe top_k > experts", "[model]\nmoe_experts = 4\nmoe_top_k = 6\n", {0}, 1,
     {"moe_top_k must be at most moe_experts", "model.moe_top_k = 6 (@:3)", "model.moe_experts = 4 (@:2)"}},
    {"moe all dense", "[model]\nmoe_experts = 4\nmoe_first_dense_layers = 4\n", {0}, 1,
     {"moe_first_dense_layers must leave at least one MoE block", "model.n_layers = 4 (default)"}},
    {"moe shared width alone", "[model]\nmoe_experts = 4\nmoe_shared_ffn_dim = 64\n", {0}, 1,
     {"moe_shared_ffn_dim is set without a shared expert", "model.moe_shared_experts = 0 (default)"}},
    {"moe with zb-h1", "[model]\nmoe_experts = 4\n[parallel]\npp = 2\npp_schedule = zb-h1\n", {0}, 2,
     {"model.moe_experts = 4 (@:2) with parallel.pp_schedule = zb-h1 (@:5)", "split B/W backward",
      "comes later"}},
    {"ep with zero 3", "[model]\nmoe_experts = 4\n[parallel]\ndp = 2\nep = 2\nzero_stage = 3\n", {0}, 2,
     {"parallel.ep = 2 (@:5) with parallel.zero_stage = 3 (@:6)", "expert_dp", "zero_stage = 0 or 1"}},
    {"moe with fp8", "[model]\nmoe_experts = 4\n[precision]\ndtype = bf16\nfp8 = hybrid\n", {0}, 1,
     {"with precision.fp8 = hybrid (@:5)", "no FP8 path"}},
    {"layers < pp", "[model]\nn_layers = 2\n[parallel]\npp = 4\n", {0}, 4,
     {"n_layers must be at least pp * virtual_stages = 4", "model.n_layers = 2 (@:2)", "parallel.pp = 4 (@:4)"}},
    {"layers < pp * virtual", "[parallel]\npp = 2\nvirtual_stages = 4\n", {0}, 2,
     {"pp * virtual_stages = 8", "parallel.virtual_stages = 4 (@:3)"}},
    {"global batch", "[train]\nglobal_batch_size = 24\n[parallel]\ndp = 2\n", {0}, 2,
     {"micro_batch_size * dp = 16", "train.global_batch_size = 24 (@:2)", "train.micro_batch_size = 8 (default)"}},
    {"seq_len > max_seq_len", "[train]\nseq_len = 512\n", {0}, 1,
     {"seq_len must be <= max_seq_len", "train.seq_len = 512 (@:2)", "model.max_seq_len = 256 (default)"}},
    {"sequence parallel", "[train]\nseq_len = 127\n[parallel]\ntp = 2\nsequence_parallel = true\n", {0}, 2,
     {"seq_len / cp (a rank's tokens of a sequence) must be a multiple of tp", "train.seq_len = 127"}},
    {"min_lr > lr", NULL, {"train.min_lr=0.1"}, 1, {"min_lr must be <= lr", "train.min_lr = 0.1 (command line argument 1)"}},
    {"warmup > steps", "[train]\nsteps = 10\nwarmup_steps = 20\n", {0}, 1,
     {"warmup_steps must be <= steps", "warmup_steps = 20 (@:3)", "steps = 10 (@:2)"}},
    {"top_k > vocab", NULL, {"train.sample_top_k=9000"}, 1, {"sample_top_k must be <= vocab_size", "9000"}},
    // Finite values that overflow or underflow fp32 (check_fp32 in config_validate.c).
    {"init_std 1e300", NULL, {"model.init_std=1e300"}, 1,
     {"model.init_std = 1e+300 (command line argument 1)", "overflows fp32", "3.40282e+38"}},
    // sqrt(FLT_MAX x 1e-6 / (256 x 32)) = 2.038e14 (Python) at the defaults' d_model 256, head size 32
    {"init_std 1e15", NULL, {"model.init_std=1e15"}, 1,
     {"model.init_std = 1e+15", "attention scores overflow fp32", "init_std <= 2.04e+14"}},
    {"init_std 1e14 wider", NULL, {"model.init_std=1e14", "model.d_model=1024"}, 1,
     {"model.init_std = 100000000000000", "init_std <= 5.1e+13 at d_model = 1024, head size 128"}},
    {"lr 1e15", NULL, {"train.lr=1e15", "train.weight_decay=0"}, 1,
     {"train.lr = 1e+15", "attention scores overflow fp32", "lr <= 2.04e+14"}},
    {"adam_eps 1e-50", NULL, {"train.adam_eps=1e-50"}, 1,
     {"train.adam_eps = 1e-50", "underflows fp32", "1.17549e-38"}},
    {"norm_eps 1e-40", NULL, {"model.norm_eps=1e-40"}, 1, {"model.norm_eps = 1e-40", "underflows fp32"}},
    {"loss scale 1e39", NULL, {"precision.loss_scale_initial=1e39"}, 1,
     {"precision.loss_scale_initial = 1e+39", "overflows fp32"}},
    {"rope_theta < 1", NULL, {"model.rope_theta=0.5"}, 1, {"model.rope_theta = 0.5", "the limit is > 1"}},
    // issue 28's options
    {"odd head_dim", NULL, {"model.head_dim=7"}, 1, {"head size must be even", "model.head_dim = 7"}},
    {"head_dim skips d_model % heads", NULL, {"model.d_model=100", "model.head_dim=0"}, 1,
     {"d_model must be a multiple of n_heads (or set head_dim)", "model.head_dim = 0"}},
    {"llama3 high <= low", NULL, {"model.rope_scaling=llama3", "model.rope_high_freq_factor=1"}, 1,
     {"rope_high_freq_factor > rope_low_freq_factor", "model.rope_high_freq_factor = 1 (command line argument 2)",
      "model.rope_low_freq_factor = 1 (default)"}},
    {"rope factor without scaling", NULL, {"model.rope_scaling_factor=8"}, 1,
     {"model.rope_scaling_factor = 8 (command line argument 1) is not read by", "model.rope_scaling = none (default)"}},
    {"llama3 keys with linear", NULL, {"model.rope_scaling=linear", "model.rope_original_max_pos=8"}, 1,
     {"model.rope_original_max_pos = 8", "is not read by", "model.rope_scaling = linear"}},
    {"rope factor 0", NULL, {"model.rope_scaling=linear", "model.rope_scaling_factor=0"}, 1,
     {"model.rope_scaling_factor"}},
    // Another trainer's names (config_aliases): trident's key named, in its own section.
    {"megatron name", "[model]\nmoe_router_topk = 2\n", {0}, 1,
     {"@:2: unknown key 'moe_router_topk' in [model]; Megatron-LM's --moe-router-topk is model.moe_top_k here"}},
    {"megatron name of another section", "[model]\ntensor_model_parallel_size = 2\n", {0}, 1,
     {"@:2", "'tensor_model_parallel_size' in [model]", "Megatron-LM's --tensor-model-parallel-size is parallel.tp here"}},
    {"megatron name with dashes", NULL, {"parallel.pipeline-model-parallel-size=2"}, 1,
     {"argument 1", "Megatron-LM's --pipeline-model-parallel-size is parallel.pp here"}},
    {"megatron flag with a value", "[precision]\nbf16 = true\n", {0}, 1,
     {"@:2", "Megatron-LM's --bf16 is precision.dtype = bf16 here"}},
    {"megatron name with a note", "[parallel]\nnum_layers_per_virtual_pipeline_stage = 2\n", {0}, 1,
     {"@:2", "is parallel.virtual_stages here (counted in model chunks per pipeline rank"}},
    {"megatron name without a key", "[model]\nmoe_router_load_balancing_type = aux_loss\n", {0}, 1,
     {"@:2", "Megatron-LM's --moe-router-load-balancing-type has no key here", "model.moe_aux_loss_coeff"}},
    {"megatron name before any section", "num_layers = 2\n", {0}, 1,
     {"@:1", "'num_layers' comes before any [section] header", "Megatron-LM's --num-layers is model.n_layers here"}},
    {"megatron override without section", NULL, {"tensor_model_parallel_size=2"}, 1,
     {"argument 1", "expected section.key=value", "Megatron-LM's --tensor-model-parallel-size is parallel.tp here"}},
    {"llm.c name", "[train]\nlearning_rate = 0.1\n", {0}, 1, {"@:2", "llm.c's -l (learning_rate) is train.lr here"}},
    {"llm.c name upper case", "[train]\nB = 4\n", {0}, 1, {"@:2", "llm.c's -b (B) is train.micro_batch_size here"}},
};

// The fp32 bounds let the largest sane values through: init_std just below
// sqrt(FLT_MAX x 1e-6 / (C D)), rope_theta 1.0001; and a divergent lr that
// overflows nothing at the start (tests/e2e/train_nonfinite.sh's 3e4).
static void test_fp32_edges(void) {
    const char *ok[] = {"model.init_std=2e14", "train.weight_decay=0.3", "model.rope_theta=1.0001"};
    const char *lr[] = {"train.lr=3e4", "train.min_lr=0"};
    struct config c;
    struct error err = {0};
    EXPECT(config_load(NULL, 3, (char **)ok, &c, &err) == STATUS_OK && config_validate(&c, 1, false, &err) == STATUS_OK,
           "fp32 edges refused: %s", err.msg);
    EXPECT(config_load(NULL, 2, (char **)lr, &c, &err) == STATUS_OK && config_validate(&c, 1, false, &err) == STATUS_OK,
           "lr 3e4 refused: %s", err.msg);
}

// issue 31: the MoE decoder under the interleaved schedule (1f1b's table at
// virtual_stages > 1, which it runs) validates, as 1f1b with virtual_stages 2
// does, and so do recompute = selective and full (model_pass.c recomputes
// MoE blocks), and ZeRO-2/3 at ep 1; the split schedules stay refused
// (bad_cases' "moe with zb-h1").
static void test_moe_interleaved(void) {
    const char *ov[] = {"model.moe_experts=4", "parallel.pp=2", "parallel.virtual_stages=2",
                        "parallel.pp_schedule=interleaved"};
    struct config c;
    struct error err = {0};
    EXPECT(config_load(NULL, 4, (char **)ov, &c, &err) == STATUS_OK && config_validate(&c, 2, false, &err) == STATUS_OK,
           "moe with the interleaved schedule refused: %s", err.msg);
    ov[3] = "parallel.pp_schedule=1f1b";
    EXPECT(config_load(NULL, 4, (char **)ov, &c, &err) == STATUS_OK && config_validate(&c, 2, false, &err) == STATUS_OK,
           "moe with 1f1b at virtual_stages 2 refused: %s", err.msg);
    const char *rc[] = {"model.moe_experts=4", "parallel.dp=2", "parallel.ep=2", "model.recompute=full"};
    for (int i = 0; i < 2; i++, rc[3] = "model.recompute=selective")
        EXPECT(config_load(NULL, 4, (char **)rc, &c, &err) == STATUS_OK &&
                   config_validate(&c, 2, false, &err) == STATUS_OK,
               "moe at ep 2 with %s refused: %s", rc[3], err.msg);
    // ZeRO-2/3 at ep 1 (the experts sharded over the shard group as any block
    // tensor); under ep they stay refused (bad_cases' "ep with zero 3")
    const char *z[] = {"model.moe_experts=4", "parallel.dp=2", "parallel.zero_stage=2"};
    for (int i = 0; i < 2; i++, z[2] = "parallel.zero_stage=3")
        EXPECT(config_load(NULL, 3, (char **)z, &c, &err) == STATUS_OK &&
                   config_validate(&c, 2, false, &err) == STATUS_OK,
               "moe at ep 1 with %s refused: %s", z[2], err.msg);
}

// ZeRO-1 composes with expert parallelism (the experts' state over expert_dp).
static void test_ep_zero1(void) {
    const char *ov[] = {"model.moe_experts=4", "parallel.dp=2", "parallel.ep=2", "parallel.zero_stage=1"};
    struct config c;
    struct error err = {0};
    EXPECT(config_load(NULL, 4, (char **)ov, &c, &err) == STATUS_OK && config_validate(&c, 2, false, &err) == STATUS_OK,
           "ep 2 with zero_stage 1 refused: %s", err.msg);
}

// issue 28's options: a valid set loads, validates and reaches the model's
// llama_config through plan_llama (head_dim 24 with d_model 100 % n_heads 8
// != 0: only head_dim's size matters then).
static void test_model_options(void) {
    const char *ov[] = {"model.d_model=100", "model.head_dim=24", "model.qkv_bias=true",
                        "model.qk_norm=true", "model.rope_scaling=llama3",
                        "model.rope_scaling_factor=8"};
    struct config c;
    struct error err = {0};
    EXPECT(config_load(NULL, 6, (char **)ov, &c, &err) == STATUS_OK && config_validate(&c, 1, false, &err) == STATUS_OK,
           "the options refused: %s", err.msg);
    // a default written out (a run folder's config.ini holds every key) is not refused
    const char *defaults[] = {"model.rope_scaling_factor=1", "model.rope_original_max_pos=8192"};
    struct config d;
    EXPECT(config_load(NULL, 2, (char **)defaults, &d, &err) == STATUS_OK &&
           config_validate(&d, 1, false, &err) == STATUS_OK, "rope defaults written out refused: %s", err.msg);
    struct llama_config lc = plan_llama(&c);
    EXPECT(lc.head_dim == 24 && llama_head_dim(&lc) == 24 && lc.qkv_bias && lc.qk_norm &&
           lc.rope_scaling.type == ROPE_SCALING_LLAMA3 && lc.rope_scaling.factor == 8 &&
           lc.rope_scaling.low_freq_factor == 1 && lc.rope_scaling.high_freq_factor == 4 &&
           lc.rope_scaling.original_max_pos == 8192,
           "plan_llama: head_dim %d qkv_bias %d qk_norm %d rope_scaling %d factor %g low %g high %g orig %d",
           lc.head_dim, lc.qkv_bias, lc.qk_norm, (int)lc.rope_scaling.type, lc.rope_scaling.factor,
           lc.rope_scaling.low_freq_factor, lc.rope_scaling.high_freq_factor, lc.rope_scaling.original_max_pos);
}

static void test_bad_inputs(void) {
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
    EXPECT(n >= 30, "at least 30 bad cases: %d", n);
    for (int i = 0; i < n; i++) {
        const struct bad_case *bc = &bad_cases[i];
        if (bc->ini) write_tmp(bc->ini);
        int n_ov = 0;
        while (n_ov < 3 && bc->ov[n_ov]) n_ov++;
        struct config c;
        struct error err = {.status = STATUS_OK, .msg = ""};
        enum status st = config_load(bc->ini ? tmp_path : NULL, n_ov, (char **)bc->ov, &c, &err);
        if (st == STATUS_OK) st = config_validate(&c, bc->world, false, &err);
        EXPECT(st == STATUS_BAD_INPUT && err.status == STATUS_BAD_INPUT, "%s: status %d, message '%s'", bc->name,
               (int)st, err.msg);
        for (int j = 0; j < 5 && bc->frag[j]; j++) {
            char want[256];
            expand(bc->frag[j], want, sizeof want);
            EXPECT(contains(err.msg, want), "%s: message '%s' lacks '%s'", bc->name, err.msg, want);
        }
        if (getenv("TEST_VERBOSE")) printf("  %-28s %s\n", bc->name, err.msg);
    }
    // Cases that need more than a table row.
    struct config c;
    struct error err = {0};
    EXPECT(config_load("/nonexistent/x.ini", 0, NULL, &c, &err) == STATUS_BAD_INPUT &&
               contains(err.msg, "cannot open config file '/nonexistent/x.ini'"),
           "missing file: %s", err.msg);
    // Lines longer than inih's 200-byte buffer: values up to CONFIG_PATH_MAX.
    char text[1200], longp[400];
    memset(longp, 'p', 300);
    longp[0] = '/', longp[300] = '\0';
    snprintf(text, sizeof text, "# %0300d\n[data]\npath = %s ; comment\n", 0, longp);
    write_tmp(text);
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_OK && !strcmp(c.data.path, longp),
           "300-byte path on a long line loads: %s", err.msg);
    snprintf(text, sizeof text, "[data]\npath = %0900d\n", 0);
    write_tmp(text);
    char want[128];
    snprintf(want, sizeof want, "%s:2: data.path", tmp_path);
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_BAD_INPUT && contains(err.msg, want) &&
               contains(err.msg, "900 bytes long; the limit is 511"),
           "900-byte path: %s", err.msg);
    snprintf(text, sizeof text, "[data]\n%0300d = 1\n", 0);
    write_tmp(text);
    snprintf(want, sizeof want, "%s:2: line is", tmp_path);
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_BAD_INPUT && contains(err.msg, want),
           "300-byte key: %s", err.msg);
    char *pound[] = {"data.path=#x"};
    EXPECT(config_load(NULL, 1, pound, &c, &err) == STATUS_BAD_INPUT && contains(err.msg, "read back as a comment"),
           "a path starting with #: %s", err.msg);
    char *ov[] = {"data.path=a #b"};
    EXPECT(config_load(NULL, 1, ov, &c, &err) == STATUS_BAD_INPUT && contains(err.msg, "whitespace before #"),
           "a path print could not write back: %s", err.msg);
    char *cuda[] = {"system.device=cuda"};
    EXPECT(config_load(NULL, 1, cuda, &c, &err) == STATUS_OK && config_validate(&c, 1, true, &err) == STATUS_OK,
           "device = cuda is fine in a CUDA build: %s", err.msg);
    char *cudnn[] = {"system.device=cuda", "system.attention=cudnn", "precision.dtype=bf16"};
    EXPECT(config_load(NULL, 3, cudnn, &c, &err) == STATUS_OK && config_validate(&c, 1, true, &err) == STATUS_OK,
           "attention = cudnn is fine with device = cuda in bf16: %s", err.msg);
    EXPECT(config_load(NULL, 2, cudnn, &c, &err) == STATUS_OK &&
               config_validate(&c, 1, true, &err) == STATUS_BAD_INPUT && contains(err.msg, "system.attention = cudnn") &&
               contains(err.msg, "precision.dtype = fp32"),
           "attention = cudnn in fp32 is refused naming both keys: %s", err.msg);
    char *cudnn_docs[] = {"system.device=cuda", "system.attention=cudnn", "precision.dtype=bf16",
                          "data.packing=concat_reset"};
    EXPECT(config_load(NULL, 4, cudnn_docs, &c, &err) == STATUS_OK &&
               config_validate(&c, 1, true, &err) == STATUS_BAD_INPUT && contains(err.msg, "system.attention = cudnn") &&
               contains(err.msg, "data.packing = concat_reset"),
           "attention = cudnn with packing = concat_reset is refused naming both keys: %s", err.msg);
    char *wide[] = {"system.device=cuda", "model.d_model=1024", "model.n_heads=2", "model.n_kv_heads=2"};
    EXPECT(config_load(NULL, 4, wide, &c, &err) == STATUS_OK &&
               config_validate(&c, 1, true, &err) == STATUS_BAD_INPUT && contains(err.msg, "head size") &&
               contains(err.msg, "512") && contains(err.msg, "model.n_heads = 2"),
           "device = cuda with head size 512 is refused naming the keys: %s", err.msg);
    wide[0] = "system.device=cpu";
    EXPECT(config_load(NULL, 4, wide, &c, &err) == STATUS_OK && config_validate(&c, 1, true, &err) == STATUS_OK,
           "head size 512 is fine on the cpu: %s", err.msg);
}

// ---- other trainers' names, keys nothing reads -------------------------------------

// The alias table's rows against the key table: no name is a trident key (it
// would never reach the unknown-key message), names are unique, each target
// names a key, and a target with a value (section.key = value) loads; a row
// without a target says why.
static void test_aliases(void) {
    EXPECT(config_n_aliases >= 40, "alias rows: %d", config_n_aliases);
    for (int a = 0; a < config_n_aliases; a++) {
        const struct config_alias *al = &config_aliases[a];
        for (int i = 0; i < config_n_keys; i++)
            EXPECT(strcasecmp(al->name, config_keys[i].key), "alias %s is the key %s.%s", al->name,
                   config_keys[i].section, config_keys[i].key);
        for (int b = 0; b < a; b++)
            EXPECT(strcasecmp(al->name, config_aliases[b].name), "alias %s twice", al->name);
        if (!al->target) {
            EXPECT(al->note && al->note[0], "alias %s: no target and no note", al->name);
            continue;
        }
        char sec[32], key[64], value[64] = "";
        int got = sscanf(al->target, "%31[a-z].%63[a-z0-9_] = %63s", sec, key, value);
        EXPECT(got >= 2 && config_key_index(sec, key) >= 0, "alias %s: target '%s' is no key", al->name,
               al->target);
        if (got == 3 && islower((unsigned char)value[0])) { // "CHECKPOINT", "N": placeholders
            char over[160];
            snprintf(over, sizeof over, "%s.%s=%s", sec, key, value);
            char *ov[] = {over};
            struct config c;
            struct error err = {0};
            EXPECT(config_load(NULL, 1, ov, &c, &err) == STATUS_OK, "alias %s: %s: %s", al->name, over, err.msg);
        }
    }
    char hint[256] = "untouched";
    EXPECT(!config_alias_hint("steps", hint, sizeof hint) && !strcmp(hint, "untouched"), "no hint for steps");
    EXPECT(config_alias_hint("--MOE-ROUTER-TOPK", hint, sizeof hint) &&
               !strcmp(hint, "; Megatron-LM's --moe-router-topk is model.moe_top_k here"),
           "dashes and case: '%s'", hint);
    EXPECT(config_alias_hint("-l", hint, sizeof hint) && !strcmp(hint, "; llm.c's -l (learning_rate) is train.lr here"),
           "an llm.c flag: '%s'", hint);
}

// [precision] fp8 sub-keys set while fp8 = none: named by config_unread_keys
// (a warning at start), not refused.
static void test_unread_keys(void) {
    struct config c;
    struct error err = {0};
    char text[1024];
    config_defaults(&c);
    EXPECT(config_unread_keys(&c, text, sizeof text) == 0 && !text[0], "defaults: '%s'", text);
    const char *ov[] = {"precision.fp8_margin=2", "precision.fp8_scaling=current", "precision.fp8_skip_layers=1"};
    EXPECT(load_on(1, &c, &err, 3, ov) == STATUS_OK, "fp8 keys with fp8 = none load and validate: %s", err.msg);
    EXPECT(config_unread_keys(&c, text, sizeof text) == 3, "three keys: '%s'", text);
    const char *want[] = {"precision.fp8_scaling = current (command line argument 2), ",
                          "precision.fp8_margin = 2 (command line argument 1), ",
                          "precision.fp8_skip_layers = 1 (command line argument 3): ",
                          "have no effect with precision.fp8 = none (default)", "only FP8 linear layers read them"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        EXPECT(contains(text, want[i]), "'%s' lacks '%s'", text, want[i]);
    write_tmp("[precision]\nfp8_amax_history_len = 16\n");
    EXPECT(config_load(tmp_path, 0, NULL, &c, &err) == STATUS_OK && config_unread_keys(&c, text, sizeof text) == 1,
           "one key: '%s'", text);
    char one[256];
    snprintf(one, sizeof one, "precision.fp8_amax_history_len = 16 (%s:2): has no effect", tmp_path);
    EXPECT(contains(text, one) && contains(text, "read it "), "'%s' lacks '%s'", text, one);
    // With fp8 on they are read; a key written at its default (a run
    // folder's config.ini writes every key) is not named.
    const char *on[] = {"precision.dtype=bf16", "precision.fp8=hybrid", "precision.fp8_margin=2"};
    EXPECT(load_on(1, &c, &err, 3, on) == STATUS_OK && config_unread_keys(&c, text, sizeof text) == 0,
           "fp8 = hybrid: '%s' %s", text, err.msg);
    const char *at_default[] = {"precision.fp8_scaling=delayed", "precision.fp8_amax_history_len=1"};
    EXPECT(config_load(NULL, 2, (char **)at_default, &c, &err) == STATUS_OK &&
               config_unread_keys(&c, text, sizeof text) == 0,
           "keys at their defaults: '%s'", text);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--write-docs")) {
        FILE *f = fopen("docs/config.md", "w");
        if (!f) {
            perror("docs/config.md");
            return 1;
        }
        config_write_docs(f);
        fclose(f);
        printf("wrote docs/config.md\n");
        return 0;
    }
    snprintf(tmp_path, sizeof tmp_path, "/tmp/trident-config-XXXXXX");
    int fd = mkstemp(tmp_path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    test_contract_keys();
    test_defaults();
    test_dp_inference();
    test_tiny();
    test_overrides();
    test_sizes_and_comments();
    test_round_trip();
    test_docs();
    test_bad_inputs();
    test_fp32_edges();
    test_model_options();
    test_moe_interleaved();
    test_ep_zero1();
    test_aliases();
    test_unread_keys();
    unlink(tmp_path);
    return test_finish("test_config");
}
