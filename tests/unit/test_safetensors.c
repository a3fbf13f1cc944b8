// test_safetensors.c: the safetensors reader and writer (src/ckpt/safetensors.c).
// Proves: a written file has the layout of the format's README byte for byte
// (8-byte little-endian header length, a JSON header padded with spaces to an
// 8-byte boundary, tensors back to back in the order given), checked by
// parsing the bytes here, not with the reader; a file whose header is written
// by hand (as Python's safetensors writes it) reads back its values and
// metadata; partial reads return the right bytes; and every bad file (too
// short, header length past the end, truncated data, overlapping offsets,
// unknown dtype, offsets not matching the shape, a header not JSON, a
// duplicate name) is refused with STATUS_BAD_INPUT naming the file and the
// tensor at fault.
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "test.h"

static char dir[] = "/tmp/test_safetensors.XXXXXX";

// Writes a file: 8-byte length of hdr (padded with spaces to pad_to bytes
// when longer), hdr, then data_bytes bytes of value i & 0xff.
static void write_raw(const char *path, const char *hdr, size_t data_bytes) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(hdr);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_bad(const char *name, const char *hdr, size_t data_bytes, const char *needle1,
                       const char *needle2) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    write_raw(path, hdr, data_bytes);
    struct safetensors_file *f = (void *)1;
    struct error err = {0};
    enum status st = safetensors_open(path, &f, &err);
    EXPECT(st == STATUS_BAD_INPUT && f == NULL, "%s: status %d, want %d", name, st,
           STATUS_BAD_INPUT);
    EXPECT(strstr(err.msg, path) != NULL, "%s: message does not name the file: %s", name, err.msg);
    if (needle1) EXPECT(strstr(err.msg, needle1) != NULL, "%s: no '%s' in: %s", name, needle1, err.msg);
    if (needle2) EXPECT(strstr(err.msg, needle2) != NULL, "%s: no '%s' in: %s", name, needle2, err.msg);
}

static void test_write_layout(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040}; // bf16 1, 2, -3
    struct safetensors_entry e[2] = {
        {.name = "model.a", .dtype = DTYPE_FP32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = DTYPE_BF16, .ndim = 1, .shape = {3}, .data = b},
    };
    const char *meta[] = {"format", "pt"};
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    struct error err = {0};
    EXPECT(safetensors_write(path, e, 2, meta, 1, &err) == STATUS_OK, "write: %s", err.msg);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    EXPECT(access(tmp, F_OK) != 0, "the .tmp file is left behind");
    // Parse the bytes independently.
    FILE *fp = fopen(path, "rb");
    unsigned char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    EXPECT((8 + n) % 8 == 0, "data starts at %llu, not 8-aligned", (unsigned long long)(8 + n));
    EXPECT(got == 8 + n + 24 + 6, "file is %zu bytes, want %llu", got,
           (unsigned long long)(8 + n + 30));
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"model.a\":{\"dtype\":\"F32\","
                       "\"shape\":[2,3],\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"BF16\","
                       "\"shape\":[3],\"data_offsets\":[24,30]}}";
    size_t wl = strlen(want);
    EXPECT(n >= wl && !memcmp(buf + 8, want, wl), "header is %.*s", (int)n, buf + 8);
    for (size_t i = wl; i < n; i++) EXPECT(buf[8 + i] == ' ', "padding byte %zu is %d", i, buf[8 + i]);
    EXPECT(!memcmp(buf + 8 + n, a, 24) && !memcmp(buf + 8 + n + 24, b, 6), "data bytes differ");

    // A duplicate name or an unsupported dtype is refused and writes nothing.
    char path2[256];
    snprintf(path2, sizeof path2, "%s/dup.safetensors", dir);
    struct safetensors_entry d[2] = {e[0], e[0]};
    EXPECT(safetensors_write(path2, d, 2, NULL, 0, &err) == STATUS_BAD_INPUT, "duplicate name");
    EXPECT(access(path2, F_OK) != 0, "a refused write left a file");
    // So is a name of invalid UTF-8 (a JSON key must be UTF-8: the header lacked it)
    d[1].name = "b\xff";
    EXPECT(safetensors_write(path2, d, 2, NULL, 0, &err) == STATUS_BAD_INPUT, "invalid UTF-8 name");
    EXPECT(access(path2, F_OK) != 0, "a refused write left a file");
}

static void test_read_handmade(void) {
    // The header as Python's safetensors writes it: sorted keys, spaces to align.
    char path[256];
    snprintf(path, sizeof path, "%s/hand.safetensors", dir);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                      "\"data_offsets\":[8,24]},\"y\":{\"dtype\":\"I64\",\"shape\":[1],"
                      "\"data_offsets\":[0,8]},\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],"
                      "\"data_offsets\":[24,24]}}    ";
    write_raw(path, hdr, 24);
    struct safetensors_file *f;
    struct error err = {0};
    EXPECT(safetensors_open(path, &f, &err) == STATUS_OK, "open: %s", err.msg);
    if (!f) return;
    EXPECT(safetensors_n_tensors(f) == 3, "%d tensors", safetensors_n_tensors(f));
    const char *fm = safetensors_metadata(f, "format");
    EXPECT(fm && !strcmp(fm, "pt"), "metadata format %s", fm ? fm : "(null)");
    const struct safetensors_tensor *x = safetensors_find(f, "x");
    EXPECT(x && x->dtype == DTYPE_FP32 && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 2,
           "tensor x parsed wrong");
    unsigned char got[16];
    if (x) {
        EXPECT(safetensors_read(f, x, 0, 16, got, &err) == STATUS_OK, "read: %s", err.msg);
        for (int i = 0; i < 16; i++) EXPECT(got[i] == 8 + i, "x byte %d = %d", i, got[i]);
        EXPECT(safetensors_read(f, x, 4, 8, got, &err) == STATUS_OK, "partial read: %s", err.msg);
        for (int i = 0; i < 8; i++) EXPECT(got[i] == 12 + i, "x partial byte %d = %d", i, got[i]);
        EXPECT(safetensors_read(f, x, 12, 8, got, &err) == STATUS_BAD_INPUT, "read past x");
    }
    const struct safetensors_tensor *z = safetensors_find(f, "z");
    EXPECT(z && z->dtype == DTYPE_FP16 && z->shape[0] == 0, "empty tensor z");
    EXPECT(!safetensors_find(f, "w"), "found a tensor not there");
    safetensors_close(f);
}

static void test_bad(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    fwrite("\x10\0\0", 1, 3, fp);
    fclose(fp);
    struct safetensors_file *f;
    struct error err = {0};
    EXPECT(safetensors_open(path, &f, &err) == STATUS_BAD_INPUT && strstr(err.msg, path),
           "3-byte file: %s", err.msg);
    // header length past the end of the file
    snprintf(path, sizeof path, "%s/hlen.safetensors", dir);
    fp = fopen(path, "wb");
    fwrite("\xff\x00\x00\x00\x00\x00\x00\x00{}", 1, 10, fp);
    fclose(fp);
    EXPECT(safetensors_open(path, &f, &err) == STATUS_BAD_INPUT && strstr(err.msg, "header length"),
           "header past the end: %s", err.msg);
    EXPECT(safetensors_open("/nonexistent/x.safetensors", &f, &err) == STATUS_BAD_INPUT,
           "missing file");
    expect_bad("truncated", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
               "tensor w", "past the end");
    expect_bad("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap",
               "b [4, 12)");
    expect_bad("dtype", "{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
               "tensor q", "F8_E4M3");
    expect_bad("span", "{\"s\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
               "tensor s", "need 12");
    expect_bad("backwards", "{\"r\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
               "tensor r", "begin <= end");
    expect_bad("notjson", "{\"a\":{\"dtype\":", 8, "not a JSON object", NULL);
    expect_bad("dup", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "JSON", NULL);
    expect_bad("noshape", "{\"m\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor m", NULL);
    expect_bad("negshape", "{\"m\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "tensor m", "shape[0]");
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    test_write_layout();
    test_read_handmade();
    test_bad();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
    return test_finish("test_safetensors");
}
