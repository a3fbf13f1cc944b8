// test_step_plan.c: the rules of the training loop (step_plan, src/train/
// step_plan.h) as a table: for a config and the run's state after a step,
// what the loop logs, saves, evaluates, samples and whether and why it stops.
// A changed rule changes a row's verdict and fails here.
#include <string.h>

#include "test.h"
#include "train/step_plan.h"

// steps 10, log every 5, eval every 4, sample every 6, save every 3,
// no exit_interval, 3 skips in a row stop, a dir, validation, a sampler.
static const struct plan_config BASE = {.steps = 10, .log_every = 5, .eval_every = 4, .sample_every = 6,
                                        .checkpoint_every = 3, .exit_interval = 0, .max_skipped_steps = 3,
                                        .saves = true, .has_val = true, .has_sampler = true};

struct row {
    const char *what;
    struct plan_config c;  // .steps 0: BASE
    struct plan_state s;
    // expected: log, save, evaluate, sample, stop, save_why, ended
    bool log, save, evaluate, sample;
    enum plan_stop stop;
    const char *save_why, *ended;
};

// CFG(changes): BASE with some fields changed (a designated initializer
// given twice takes the later value).
#pragma GCC diagnostic ignored "-Woverride-init"
#define CFG(...) ((struct plan_config){.steps = 10, .log_every = 5, .eval_every = 4, .sample_every = 6, \
    .checkpoint_every = 3, .max_skipped_steps = 3, .saves = true, .has_val = true, .has_sampler = true, __VA_ARGS__})

static const struct row ROWS[] = {
    {"a quiet step", {0}, {.step = 1}, false, false, false, false, PLAN_CONTINUE, "", ""},
    {"the first step of a start logs", {0}, {.step = 1, .start_step = 1}, true, false, false, false,
     PLAN_CONTINUE, "", ""},
    {"log every 5", {0}, {.step = 4}, true, false, false, false, PLAN_CONTINUE, "", ""},
    {"save every 3", {0}, {.step = 2}, false, true, false, false, PLAN_CONTINUE, "every", ""},
    {"eval every 4", {0}, {.step = 3}, false, false, true, false, PLAN_CONTINUE, "", ""},
    {"sample every 6 (and save every 3)", {0}, {.step = 5}, false, true, false, true, PLAN_CONTINUE, "every", ""},
    {"a skipped step logs and holds the periodic save", {0}, {.step = 2, .skipped = true, .consecutive_skips = 1},
     true, false, false, false, PLAN_CONTINUE, "", ""},
    {"too many skips: log, stop, no save", {0}, {.step = 2, .skipped = true, .consecutive_skips = 3},
     true, false, false, false, PLAN_TOO_MANY_SKIPS, "", "max_skipped_steps"},
    {"too many skips before a signal", {0}, {.step = 1, .skipped = true, .consecutive_skips = 3, .signal = 15},
     true, false, false, false, PLAN_TOO_MANY_SKIPS, "", "max_skipped_steps"},
    {"the last step: log, save, eval, sample, completed", {0}, {.step = 9}, true, true, true, true,
     PLAN_COMPLETED, "last", "completed"},
    {"the last step saves even when skipped", {0}, {.step = 9, .skipped = true, .consecutive_skips = 1},
     true, true, true, true, PLAN_COMPLETED, "last", "completed"},
    {"a signal saves and stops, no eval or sample", {0}, {.step = 3, .signal = 15}, false, true, false, false,
     PLAN_SIGNAL, "signal", "signal"},
    {"a signal on a skipped step saves where it is", {0}, {.step = 3, .signal = 15, .skipped = true,
     .consecutive_skips = 1}, true, true, false, false, PLAN_SIGNAL, "signal", "signal"},
    {"a signal on the last step is a signal", {0}, {.step = 9, .signal = 10}, true, true, false, false,
     PLAN_SIGNAL, "signal", "signal"},
    {"exit_interval", CFG(.exit_interval = 4), {.step = 3}, false, true, false, false, PLAN_EXIT_INTERVAL,
     "exit_interval", "exit_interval"},
    {"a signal before exit_interval", CFG(.exit_interval = 4), {.step = 3, .signal = 15}, false, true, false,
     false, PLAN_SIGNAL, "signal", "signal"},
    {"exit_interval on the last step completes", CFG(.exit_interval = 5), {.step = 9}, true, true, true, true,
     PLAN_COMPLETED, "last", "completed"},
    {"out of time", {0}, {.step = 1, .over_budget = true}, false, true, false, false, PLAN_EXIT_DURATION,
     "exit_duration", "exit_duration"},
    {"exit_interval before out of time", CFG(.exit_interval = 2), {.step = 1, .over_budget = true}, false, true,
     false, false, PLAN_EXIT_INTERVAL, "exit_interval", "exit_interval"},
    {"out of time on the last step completes", {0}, {.step = 9, .over_budget = true}, true, true, true, true,
     PLAN_COMPLETED, "last", "completed"},
    {"no dir: never a save", CFG(.saves = false), {.step = 3, .signal = 15}, false, false, false, false,
     PLAN_SIGNAL, "", "signal"},
    {"no dir: the last step completes unsaved", CFG(.saves = false), {.step = 9}, true, false, true, true,
     PLAN_COMPLETED, "", "completed"},
    {"no validation split: no eval", CFG(.has_val = false), {.step = 3}, false, false, false, false,
     PLAN_CONTINUE, "", ""},
    {"no sampler: no sample", CFG(.has_sampler = false), {.step = 9}, true, true, true, false, PLAN_COMPLETED,
     "last", "completed"},
    {"intervals 0: never", CFG(.eval_every = 0, .sample_every = 0, .checkpoint_every = 0), {.step = 5},
     false, false, false, false, PLAN_CONTINUE, "", ""},
    {"a stop during evaluation saves the step", {0}, {.step = 3, .signal = 15, .interrupted = true}, false,
     true, false, false, PLAN_SIGNAL, "signal", "signal"},
    {"a stop during a sample after a periodic save: no second save", {0},
     {.step = 5, .signal = 15, .interrupted = true, .saved = true}, false, false, false, false, PLAN_SIGNAL,
     "", "signal"},
    {"a stop during the last step's evaluation", {0}, {.step = 9, .signal = 2, .interrupted = true,
     .saved = true}, false, false, false, false, PLAN_SIGNAL, "", "signal"},
    {"a stop during evaluation without a dir", CFG(.saves = false), {.step = 3, .signal = 15,
     .interrupted = true}, false, false, false, false, PLAN_SIGNAL, "", "signal"},
    {"already saved: no second save", {0}, {.step = 2, .saved = true}, false, false, false, false,
     PLAN_CONTINUE, "", ""},
};

int main(void) {
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        const struct row *r = &ROWS[i];
        struct plan_config c = r->c.steps ? r->c : BASE;
        struct step_plan p = step_plan(&c, &r->s);
        EXPECT(p.log == r->log, "%s: log %d", r->what, p.log);
        EXPECT(p.save == r->save, "%s: save %d", r->what, p.save);
        EXPECT(p.evaluate == r->evaluate, "%s: evaluate %d", r->what, p.evaluate);
        EXPECT(p.sample == r->sample, "%s: sample %d", r->what, p.sample);
        EXPECT(p.stop == r->stop, "%s: stop %d, expected %d", r->what, (int)p.stop, (int)r->stop);
        EXPECT(!strcmp(p.save_why, r->save_why), "%s: save_why '%s', expected '%s'", r->what, p.save_why,
               r->save_why);
        EXPECT(!strcmp(p.ended, r->ended), "%s: ended '%s', expected '%s'", r->what, p.ended, r->ended);
    }
    // Every step of a 10-step run with the BASE intervals: saves at 3, 6, 9
    // and the last; evaluations at 4, 8 and the last; samples at 6 and the last.
    int saves = 0, evals = 0, samples = 0, logs = 0;
    for (int step = 0; step < 10; step++) {
        struct step_plan p = step_plan(&BASE, &(struct plan_state){.step = step});
        saves += p.save, evals += p.evaluate, samples += p.sample, logs += p.log;
        EXPECT(p.stop == (step == 9 ? PLAN_COMPLETED : PLAN_CONTINUE), "step %d: stop %d", step, (int)p.stop);
    }
    EXPECT(saves == 4 && evals == 3 && samples == 2 && logs == 3, "a 10-step run: %d saves, %d evaluations, "
           "%d samples, %d log lines; expected 4, 3, 2, 3", saves, evals, samples, logs);
    return test_finish("test_step_plan");
}
