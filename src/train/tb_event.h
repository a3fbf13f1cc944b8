// tb_event.h: TensorBoard event files: the TFRecord framing and the few
// fields of tensorboard.Event / Summary that scalars need, encoded by hand
// (docs/design.md §9, "TensorBoard and Prometheus", says why not protobuf-c).
// Field numbers from tensorboard/compat/proto/event.proto and summary.proto:
//   Event:         double wall_time = 1; int64 step = 2; string file_version = 3;
//                  Summary summary = 5; SessionLog session_log = 7
//   Summary:       repeated Value value = 1
//   Summary.Value: string tag = 1; float simple_value = 2
//   SessionLog:    SessionStatus status = 1 (START = 1)
// Framing from tensorflow/core/lib/io/record_writer.cc: uint64 length (little
// endian), masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the
// data. CRC-32C (Castagnoli) is Intel ISA-L's crc32_iscsi.
#ifndef TRIDENT_TB_EVENT_H
#define TRIDENT_TB_EVENT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/common.h"

// CRC-32C of n bytes as iSCSI and TFRecord define it (initial value and final
// xor 0xffffffff, reflected): "123456789" -> 0xe3069283 (RFC 3720 B.4's
// polynomial; the check value of the CRC catalogue). ISA-L's crc32_iscsi
// takes and returns the register without the final xor, hence ~(.., ~0).
uint32_t tb_crc32c(const void *data, size_t n);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
uint32_t tb_crc_mask(uint32_t crc);

// The 12-byte record header of a record of n data bytes: n as uint64 little
// endian, then the masked CRC-32C of those 8 bytes (uint32 little endian).
void tb_record_header(uint8_t hdr[12], uint64_t n);

// The 4-byte record footer: masked CRC-32C of the n data bytes, little endian.
void tb_record_footer(uint8_t ftr[4], const uint8_t *data, size_t n);

// One scalar of an Event's Summary: tag (UTF-8, as TensorBoard shows it) and
// value (stored as float32, Summary.Value.simple_value).
struct tb_scalar {
    const char *tag;
    double value;
};

// Encodes an Event into buf (cap bytes) and returns its length, or 0 when it
// does not fit. wall_time: Unix seconds. Exactly one of the three payloads:
//   file_version != NULL: the first record of a file ("brain.Event:2");
//   n_scalars > 0: a Summary of the scalars (step = steps done);
//   else a SessionLog START at `step`: readers drop the events of an earlier
//   attempt at steps >= step (TensorBoard's EventAccumulator, purge_orphaned_data).
size_t tb_event_encode(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                       const char *file_version, const struct tb_scalar *scalars,
                       int n_scalars);

// An open event file.
struct tb_writer {
    FILE *f;
    char path[4200];
};

// Creates dir/events.out.tfevents.<unix seconds>.<hostname>.<microseconds>
// (never an existing file; name order is start order, as readers need) and writes its file_version record "brain.Event:2".
// Errors: STATUS_RUNTIME naming the file (creation or write failed).
enum status tb_writer_open(struct tb_writer *w, const char *dir, struct error *err);

// Appends one framed Event stamped with the current Unix time
// (tb_event_encode's payloads: n_scalars > 0 a Summary, 0 a SessionLog START)
// and flushes it, so that a reader sees every record written so far.
// Errors: STATUS_RUNTIME naming the file (encoding too long, write failed).
enum status tb_writer_write(struct tb_writer *w, int64_t step, const struct tb_scalar *scalars,
                            int n_scalars, struct error *err);

// Closes the file; a NULL w->f is a no-op.
void tb_writer_close(struct tb_writer *w);

#endif
