// test_tb_event.c: TensorBoard event files (src/train/tb_event.h) against
// references that are not trident's:
//  - CRC-32C (ISA-L's crc32_iscsi with trident's init/final xor) on the
//    catalogue check value ("123456789" -> 0xe3069283) and RFC 3720 B.4's
//    iSCSI vectors (32 zeros, 32 0xff, 0x00..0x1f), the empty string;
//  - the TFRecord mask of 0xe3069283 computed by hand (Python, the formula of
//    tensorflow/core/lib/io/crc32c.h);
//  - three whole framed records (file_version, a Summary of two scalars, a
//    SessionLog START) byte for byte against what TensorBoard's own Python
//    writer produces for the same Events (tensorboard 2.21:
//    event_pb2.Event(...).SerializeToString() framed by
//    tensorboard.summary.writer.record_writer.RecordWriter);
//  - tb_writer_open makes events.out.tfevents.* whose first record is the
//    file_version one; an encoding too large for its buffer returns 0.
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "train/tb_event.h"

// The framed record of tb_event_encode's event, into out; its length.
static size_t frame(uint8_t *out, double wall, int64_t step, const char *version,
                    const struct tb_scalar *v, int n) {
    uint8_t data[512];
    size_t len = tb_event_encode(data, sizeof data, wall, step, version, v, n);
    EXPECT(len > 0, "encoding failed");
    tb_record_header(out, len);
    memcpy(out + 12, data, len);
    tb_record_footer(out + 12 + len, data, len);
    return len + 16;
}

static void expect_bytes(const uint8_t *got, size_t n_got, const uint8_t *want, size_t n_want,
                         const char *what) {
    EXPECT(n_got == n_want, "%s: %zu bytes, want %zu", what, n_got, n_want);
    for (size_t i = 0; i < n_got && i < n_want; i++)
        if (got[i] != want[i]) {
            EXPECT(0, "%s: byte %zu is 0x%02x, want 0x%02x", what, i, got[i], want[i]);
            break;
        }
}

int main(void) {
    // CRC-32C check values.
    EXPECT(tb_crc32c("123456789", 9) == 0xe3069283u, "got 0x%08x", tb_crc32c("123456789", 9));
    EXPECT(tb_crc32c("", 0) == 0, "empty: 0x%08x", tb_crc32c("", 0));
    uint8_t buf[32];
    memset(buf, 0, 32);
    EXPECT(tb_crc32c(buf, 32) == 0x8a9136aau, "32 zeros: 0x%08x", tb_crc32c(buf, 32));
    memset(buf, 0xff, 32);
    EXPECT(tb_crc32c(buf, 32) == 0x62a8ab43u, "32 0xff: 0x%08x", tb_crc32c(buf, 32));
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    EXPECT(tb_crc32c(buf, 32) == 0x46dd794eu, "0..31: 0x%08x", tb_crc32c(buf, 32));
    // Mask: ((x >> 15) | (x << 17)) + 0xa282ead8 of 0xe3069283.
    EXPECT(tb_crc_mask(0xe3069283u) == 0xc78ab0e5u, "mask: 0x%08x", tb_crc_mask(0xe3069283u));

    // Records as TensorBoard's writer frames them.
    static const uint8_t version[] = {
        0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e,
        0x2e, 0x45, 0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32, 0x2a, 0x28, 0x64, 0x6c};
    static const uint8_t scalars[] = {
        0x2f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6d, 0x5d, 0x1d, 0x50, 0x09, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x10, 0x07, 0x2a, 0x22, 0x0a, 0x0e, 0x0a,
        0x07, 0x6c, 0x6d, 0x20, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x50, 0x40, 0x0a,
        0x10, 0x0a, 0x09, 0x67, 0x72, 0x61, 0x64, 0x2d, 0x6e, 0x6f, 0x72, 0x6d, 0x15, 0x00,
        0x00, 0x00, 0x3f, 0xda, 0x15, 0xa3, 0x64};
    static const uint8_t start[] = {
        0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x95, 0xfb, 0xfe, 0x18, 0x09, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x40, 0x10, 0xac, 0x02, 0x3a, 0x02, 0x08, 0x01,
        0xb5, 0xc2, 0xfb, 0x5c};
    uint8_t rec[600];
    size_t n = frame(rec, 1.5, 0, "brain.Event:2", NULL, 0);
    expect_bytes(rec, n, version, sizeof version, "file_version record");
    struct tb_scalar v[2] = {{"lm loss", 3.25}, {"grad-norm", 0.5}};
    n = frame(rec, 2.0, 7, NULL, v, 2);
    expect_bytes(rec, n, scalars, sizeof scalars, "scalars record");
    n = frame(rec, 3.0, 300, NULL, NULL, 0);
    expect_bytes(rec, n, start, sizeof start, "SessionLog START record");
    uint8_t small[20];
    EXPECT(tb_event_encode(small, sizeof small, 2.0, 7, NULL, v, 2) == 0, "overflow not reported");

    // A file in a fresh folder.
    char dir[] = "/tmp/trident_tb_XXXXXX";
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
    struct tb_writer w;
    struct error err;
    EXPECT(tb_writer_open(&w, dir, &err) == STATUS_OK, "open: %s", err.msg);
    EXPECT(tb_writer_write(&w, 5, v, 2, &err) == STATUS_OK, "write: %s", err.msg);
    tb_writer_close(&w);
    EXPECT(strstr(w.path, "/events.out.tfevents.") != NULL, "name %s", w.path);
    FILE *f = fopen(w.path, "rb");
    uint8_t head[40] = {0};
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    EXPECT(got == 40 && head[0] == 0x18 && memcmp(head + 8, version + 8, 4) == 0 &&
           memcmp(head + 21, version + 21, 15) == 0, "first record is not the file_version one");
    unlink(w.path);
    rmdir(dir);
    return test_finish("test_tb_event");
}
