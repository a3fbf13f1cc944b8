// tb_event.c: TensorBoard event files (tb_event.h): TFRecord framing with
// ISA-L's CRC-32C and a hand-written encoder of the Event fields scalars use.
// Protobuf wire format: protobuf.dev/programming-guides/encoding (varints,
// tag = field << 3 | wire type; 1: 64-bit, 2: length-delimited, 5: 32-bit).

#include "tb_event.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <isa-l/crc.h>

uint32_t tb_crc32c(const void *data, size_t n) {
    // crc32_iscsi takes an int length: chunks keep any size exact.
    uint32_t crc = 0xffffffffu;
    const unsigned char *p = data;
    while (n > 0) {
        int k = n > (1u << 30) ? 1 << 30 : (int)n;
        crc = crc32_iscsi((unsigned char *)p, k, crc);
        p += k, n -= (size_t)k;
    }
    return ~crc;
}

uint32_t tb_crc_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void tb_record_header(uint8_t hdr[12], uint64_t n) {
    for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(n >> (8 * i));
    put_le32(hdr + 8, tb_crc_mask(tb_crc32c(hdr, 8)));
}

void tb_record_footer(uint8_t ftr[4], const uint8_t *data, size_t n) {
    put_le32(ftr, tb_crc_mask(tb_crc32c(data, n)));
}

// ---- protobuf encoding: a cursor that turns into "full" instead of overflowing

struct pb {
    uint8_t *p;
    size_t n, cap;
    int full;
};

static void pb_byte(struct pb *b, uint8_t v) {
    if (b->n < b->cap) b->p[b->n++] = v;
    else b->full = 1;
}

static void pb_varint(struct pb *b, uint64_t v) {
    while (v >= 0x80) pb_byte(b, (uint8_t)(v | 0x80)), v >>= 7;
    pb_byte(b, (uint8_t)v);
}

static void pb_tag(struct pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_bytes(struct pb *b, int field, const void *data, size_t n) {
    pb_tag(b, field, 2);
    pb_varint(b, n);
    for (size_t i = 0; i < n; i++) pb_byte(b, ((const uint8_t *)data)[i]);
}

static void pb_fixed(struct pb *b, int field, uint64_t bits, int bytes) {
    pb_tag(b, field, bytes == 8 ? 1 : 5);
    for (int i = 0; i < bytes; i++) pb_byte(b, (uint8_t)(bits >> (8 * i)));
}

static void pb_double(struct pb *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    pb_fixed(b, field, u, 8);
}

static void pb_float(struct pb *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    pb_fixed(b, field, u, 4);
}

// Summary.Value {tag = 1, simple_value = 2} of one scalar, into tmp.
static size_t encode_value(uint8_t *tmp, size_t cap, const struct tb_scalar *s) {
    struct pb v = {tmp, 0, cap, 0};
    pb_bytes(&v, 1, s->tag, strlen(s->tag));
    pb_float(&v, 2, (float)s->value);
    return v.full ? 0 : v.n;
}

size_t tb_event_encode(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                       const char *file_version, const struct tb_scalar *scalars,
                       int n_scalars) {
    struct pb e = {buf, 0, cap, 0};
    pb_double(&e, 1, wall_time);
    if (step) pb_tag(&e, 2, 0), pb_varint(&e, (uint64_t)step); // proto3 omits a default 0
    if (file_version) {
        pb_bytes(&e, 3, file_version, strlen(file_version));
    } else if (n_scalars > 0) {
        // Summary {repeated Value value = 1}: each value is length-delimited,
        // so the Summary's length is the sum of the framed values'.
        uint8_t summary[2048], value[256];
        struct pb s = {summary, 0, sizeof summary, 0};
        for (int i = 0; i < n_scalars; i++) {
            size_t n = encode_value(value, sizeof value, &scalars[i]);
            if (!n) return 0;
            pb_bytes(&s, 1, value, n);
        }
        if (s.full) return 0;
        pb_bytes(&e, 5, summary, s.n);
    } else {
        uint8_t session[2] = {1 << 3 | 0, 1}; // SessionLog {status = START}
        pb_bytes(&e, 7, session, sizeof session);
    }
    return e.full ? 0 : e.n;
}

// ---- the file

static enum status write_record(struct tb_writer *w, const uint8_t *data, size_t n,
                                struct error *err) {
    uint8_t hdr[12], ftr[4];
    tb_record_header(hdr, n);
    tb_record_footer(ftr, data, n);
    if (fwrite(hdr, 1, 12, w->f) != 12 || fwrite(data, 1, n, w->f) != n ||
        fwrite(ftr, 1, 4, w->f) != 4 || fflush(w->f))
        return error_set(err, STATUS_RUNTIME, "%s: cannot write a TensorBoard record: %s",
                         w->path, strerror(errno));
    return STATUS_OK;
}

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum status tb_writer_open(struct tb_writer *w, const char *dir, struct error *err) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    double now = unix_now();
    // Readers load a folder's files in name order: the seconds first (10
    // digits until 2286), the microseconds after the host name order two
    // starts within one second.
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%06ld", dir,
             (long long)now, host, (long)((now - floor(now)) * 1e6));
    w->f = NULL;
    int fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        if (fd >= 0) close(fd);
        return error_set(err, STATUS_RUNTIME, "%s: cannot create the TensorBoard event file: %s",
                         w->path, strerror(errno));
    }
    uint8_t buf[128];
    size_t n = tb_event_encode(buf, sizeof buf, now, 0, "brain.Event:2", NULL, 0);
    return write_record(w, buf, n, err);
}

enum status tb_writer_write(struct tb_writer *w, int64_t step, const struct tb_scalar *scalars,
                            int n_scalars, struct error *err) {
    uint8_t buf[4096];
    size_t n = tb_event_encode(buf, sizeof buf, unix_now(), step, NULL, scalars, n_scalars);
    if (!n) return error_set(err, STATUS_RUNTIME, "%s: a TensorBoard event of %d scalars does not "
                             "fit %zu bytes", w->path, n_scalars, sizeof buf);
    return write_record(w, buf, n, err);
}

void tb_writer_close(struct tb_writer *w) {
    if (w->f) fclose(w->f);
    w->f = NULL;
}
