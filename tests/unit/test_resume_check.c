// test_resume_check.c: what a resume may change (trainer_resume_compare,
// docs/design.md §7) and the continued LR schedule of train.override_schedule
// (optimizer_lr with rebase_step): each rule against values written out here,
// and the continued schedule against the uncontinued one and its own ends.
#include <math.h>
#include <string.h>

#include "config/config.h"
#include "model/optimizer.h"
#include "test.h"
#include "train/trainer.h"

static bool contains(const char *s, const char *frag) { return strstr(s, frag) != NULL; }

// The state a run of c would have saved (steps 60 of it, format-2 loader).
static struct trainer_saved saved_of(const struct config *c) {
    struct trainer_saved st = {.step = 60, .progress = {.lr_step = 60, .loss_on = c->train.loss_on},
                               .opt = {.has_schedule = true, .steps = c->train.steps, .lr = c->train.lr,
                                       .min_lr = c->train.min_lr, .warmup_steps = c->train.warmup_steps,
                                       .schedule = c->train.lr_schedule}};
    st.loader = (struct loader_state){.format = 2, .seed = (uint64_t)c->train.seed,
                                      .seq_len = (uint64_t)c->train.seq_len,
                                      .global_batch_size = (uint64_t)c->train.global_batch_size};
    return st;
}

static void test_compare(void) {
    struct config c;
    config_defaults(&c);
    c.train.steps = 60;
    struct trainer_saved st = saved_of(&c);
    struct resume_check rc;
    char msg[1024];
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 0 && !rc.refused && !rc.schedule_changed, "the same config: %d changes", rc.n);

    // 60 -> 80 steps without the override: refused, listed, the override named.
    c.train.steps = 80;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck/step-000060", msg, sizeof msg);
    EXPECT(rc.refused && rc.schedule_changed && rc.n == 1, "steps 60 -> 80: refused %d, n %d", rc.refused, rc.n);
    EXPECT(contains(msg, "train.steps 60 -> 80") && contains(msg, "train.override_schedule = true") &&
               contains(msg, "new [checkpoint] dir"), "message: %s", msg);
    // Every schedule key listed, with both values.
    c.train.lr = 1e-3, c.train.min_lr = 1e-5, c.train.warmup_steps = 7, c.train.lr_schedule = LR_SCHEDULE_LINEAR;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck", msg, sizeof msg);
    EXPECT(rc.n == 5 && rc.refused, "five schedule changes: %d", rc.n);
    EXPECT(contains(msg, "train.lr 0.0003 -> 0.001") && contains(msg, "train.min_lr 3e-05 -> 1e-05") &&
               contains(msg, "train.warmup_steps 100 -> 7") && contains(msg, "train.lr_schedule cosine -> linear"),
           "message: %s", msg);
    // With the override: the same list, not refused.
    c.train.override_schedule = true;
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 5 && !rc.refused && rc.schedule_changed, "override: n %d refused %d", rc.n, rc.refused);

    // A saved lr_schedule no schedule has (the checkpoint layer stores the
    // number; its owner judges it): refused, even with the override.
    config_defaults(&c);
    st = saved_of(&c);
    st.opt.schedule = 7;
    c.train.override_schedule = true;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck", msg, sizeof msg);
    EXPECT(rc.refused && rc.n == 1 && contains(msg, "train.lr_schedule 7 -> cosine") &&
               contains(msg, "none this trident knows"), "unknown lr_schedule: %s", msg);

    // Data keys: global_batch_size continues; seq_len and seed are refused,
    // even with the override (it is about the schedule only).
    config_defaults(&c);
    st = saved_of(&c);
    c.train.override_schedule = true;
    c.train.global_batch_size = 32;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck", msg, sizeof msg);
    EXPECT(rc.n == 1 && !rc.refused && contains(msg, "train.global_batch_size 16 -> 32") &&
               contains(msg, "next unconsumed sample"), "global batch: %s", msg);
    c.train.seq_len = 64, c.train.seed = 99;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck", msg, sizeof msg);
    EXPECT(rc.n == 3 && rc.refused && contains(msg, "train.seed 1234 -> 99") &&
               contains(msg, "train.seq_len 128 -> 64") && contains(msg, "seq_len and seed cannot change"),
           "seq_len, seed: %s", msg);

    // loss_on: refused in either direction, even with the override, naming
    // init_from; not compared for a checkpoint that predates it (-1).
    config_defaults(&c);
    st = saved_of(&c);
    c.train.override_schedule = true;
    c.train.loss_on = LOSS_ON_RESPONSE;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck/step-000060", msg, sizeof msg);
    EXPECT(rc.n == 1 && rc.refused && contains(msg, "train.loss_on all -> response") &&
               contains(msg, "model.init_from = ck/step-000060"), "loss_on all -> response: %s", msg);
    st.progress.loss_on = LOSS_ON_RESPONSE, c.train.loss_on = LOSS_ON_ALL;
    trainer_resume_compare(&st, &c, &rc);
    trainer_resume_message(&rc, "ck", msg, sizeof msg);
    EXPECT(rc.n == 1 && rc.refused && contains(msg, "train.loss_on response -> all"), "response -> all: %s", msg);
    c.train.loss_on = LOSS_ON_RESPONSE;
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 0 && !rc.refused, "loss_on response kept: n %d", rc.n);
    st.progress.loss_on = -1, c.train.loss_on = LOSS_ON_ALL;
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 0 && !rc.refused, "loss_on not stored: n %d", rc.n);

    // An older checkpoint (no stored schedule, a batch-index loader state):
    // the schedule and the batch are not compared, the seed still is.
    config_defaults(&c);
    st = saved_of(&c);
    st.opt.has_schedule = false, st.loader.format = 1, st.loader.seq_len = 0, st.loader.global_batch_size = 0;
    c.train.steps = 5000, c.train.global_batch_size = 64, c.train.seq_len = 64;
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 0 && !rc.refused && rc.schedule_unknown, "old checkpoint: n %d", rc.n);
    c.train.seed = 1;
    trainer_resume_compare(&st, &c, &rc);
    EXPECT(rc.n == 1 && rc.refused, "old checkpoint, seed changed: n %d", rc.n);
}

// The continued schedule: 60 -> 80 steps of a cosine from 3e-3 (warmup 5) to
// 3e-4, resumed at position 60.
static void test_continued_lr(void) {
    struct optimizer_config old = {.lr = 3e-3, .min_lr = 3e-4, .warmup_steps = 5, .steps = 60,
                                   .schedule = LR_SCHEDULE_COSINE};
    struct optimizer_config now = old;
    now.steps = 80;
    int R = 60;
    now.rebase_step = R, now.rebase_lr = optimizer_lr(&old, R - 1);
    // Without the rebase the lr jumps up at the resume (the 60 -> 80 case).
    struct optimizer_config plain = old;
    plain.steps = 80;
    double step_change = fabs(optimizer_lr(&old, R - 2) - optimizer_lr(&old, R - 1));
    EXPECT(optimizer_lr(&plain, R) - optimizer_lr(&old, R - 1) > 10 * step_change,
           "plain 80-step schedule jumps: %.3e -> %.3e", optimizer_lr(&old, R - 1), optimizer_lr(&plain, R));
    // Continued: within one step's change of the last old step; falling; min_lr
    // exactly at the new last step (79), and the cosine's value in between.
    double first = optimizer_lr(&now, R);
    EXPECT(fabs(first - now.rebase_lr) <= step_change + 1e-15, "first continued %.6e vs %.6e (step change %.2e)",
           first, now.rebase_lr, step_change);
    bool falling = true;
    for (int s = R + 1; s < 80; s++) falling = falling && optimizer_lr(&now, s) <= optimizer_lr(&now, s - 1);
    EXPECT(falling, "continued schedule falls monotonically");
    EXPECT(fabs(optimizer_lr(&now, 79) - 3e-4) < 1e-15, "last step %.9g, min_lr 3e-4", optimizer_lr(&now, 79));
    double mid = 3e-4 + 0.5 * (now.rebase_lr - 3e-4) * (1 + cos(M_PI * 10.0 / 20.0)); // step 69: ratio 10/20
    EXPECT(fabs(optimizer_lr(&now, 69) - mid) < 1e-15, "step 69: %.9g, expected %.9g", optimizer_lr(&now, 69), mid);
    EXPECT(optimizer_lr(&now, 10) == optimizer_lr(&plain, 10), "before the rebase: the new schedule as it is");
    // Linear and constant continue from the same point.
    now.schedule = LR_SCHEDULE_LINEAR;
    EXPECT(fabs(optimizer_lr(&now, 79) - 3e-4) < 1e-15 &&
               fabs(optimizer_lr(&now, 60) - (now.rebase_lr - (now.rebase_lr - 3e-4) / 20)) < 1e-15,
           "linear: %.9g at 60, %.9g at 79", optimizer_lr(&now, 60), optimizer_lr(&now, 79));
    now.schedule = LR_SCHEDULE_CONSTANT;
    EXPECT(optimizer_lr(&now, 70) == now.rebase_lr, "constant holds the reached lr");
    // Resumed inside the warmup with a longer one: the warmup goes on from the
    // reached lr to lr at the new warmup's last step; no jump.
    struct optimizer_config w = {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .steps = 100,
                                 .schedule = LR_SCHEDULE_COSINE};
    struct optimizer_config w2 = w;
    w2.warmup_steps = 20, w2.rebase_step = 4, w2.rebase_lr = optimizer_lr(&w, 3); // 4e-4
    EXPECT(fabs(optimizer_lr(&w2, 4) - (4e-4 + 6e-4 / 16)) < 1e-15 && fabs(optimizer_lr(&w2, 19) - 1e-3) < 1e-15 &&
               fabs(optimizer_lr(&w2, 20) - 1e-3) < 1e-15,
           "warmup continued: %.9g at 4, %.9g at 19, %.9g at 20", optimizer_lr(&w2, 4), optimizer_lr(&w2, 19),
           optimizer_lr(&w2, 20));
    // Same warmup, only steps changed: identical to the original warmup.
    w2 = w, w2.steps = 200, w2.rebase_step = 4, w2.rebase_lr = optimizer_lr(&w, 3);
    for (int s = 4; s < 10; s++)
        EXPECT(fabs(optimizer_lr(&w2, s) - optimizer_lr(&w, s)) < 1e-15, "warmup step %d", s);
}

int main(void) {
    test_compare();
    test_continued_lr();
    return test_finish("test_resume_check");
}
