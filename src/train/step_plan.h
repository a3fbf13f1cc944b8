// step_plan.h: what the training loop does after a step, decided by one pure
// function (docs/design.md §9 "The loop"): log, save, evaluate, sample, stop,
// and why. trainer_run (train.c) gathers the run's state after each step
// (the agreed stop flag and time verdict, the step's skip, the intervals of
// the config) and performs what the plan says, in the order the plan's fields
// are listed; a stop that arrives during the step's evaluation or sample asks
// the plan again with interrupted set. No I/O, no collectives, no clock:
// tests/unit/test_step_plan.c holds the table of its rules.
#ifndef TRIDENT_STEP_PLAN_H
#define TRIDENT_STEP_PLAN_H

#include <stdbool.h>

// Why a run stops after a step (PLAN_CONTINUE: it does not).
enum plan_stop {
    PLAN_CONTINUE,      // on to the next step
    PLAN_COMPLETED,     // the last step ([train] steps) is done
    PLAN_SIGNAL,        // a stop signal (any rank's): exit 3 after the save
    PLAN_EXIT_INTERVAL, // [train] exit_interval: exit 0 after the save
    PLAN_EXIT_DURATION, // the next step would pass [train] exit_duration_mins: exit 3
    PLAN_TOO_MANY_SKIPS // [train] max_skipped_steps skipped steps in a row: an error, no save
};

// The config's intervals (0: never) and what the run has.
struct plan_config {
    int steps;             // [train] steps
    int log_every;         // [log] every (>= 1)
    int eval_every;        // [train] eval_every
    int sample_every;      // [train] sample_every
    int checkpoint_every;  // [checkpoint] every
    int exit_interval;     // [train] exit_interval
    int max_skipped_steps; // [train] max_skipped_steps
    bool saves;            // a [checkpoint] dir is set
    bool has_val;          // a validation split of at least one global batch
    bool has_sampler;      // a tokenizer and a whole-model stage: samples can run
};

// The run's state after step `step` (counted from 0: step + 1 steps are done).
struct plan_state {
    int step;              // the step just done
    int start_step;        // the first step of this start (a resume's checkpoint step)
    bool skipped;          // the step was skipped (non-finite loss or gradient norm)
    int consecutive_skips; // skipped steps in a row counting toward max_skipped_steps
    int signal;            // the stop flag agreed over the world (a signal number; 0 none)
    bool over_budget;      // the next step would end past exit_duration_mins (any rank's verdict)
    bool interrupted;      // signal arrived during this step's evaluation or sample
    bool saved;            // a checkpoint of step + 1 steps is already written
};

// What to do after the step, in this order: log, (stop with too many skips),
// save, (stop), evaluate, sample. save_why: the reason for the save
// ("signal", "exit_interval", "exit_duration", "last", "every"; "" none) and
// ended: the metrics.jsonl "ended" word of a stop ("completed", "signal",
// "exit_interval", "exit_duration", "max_skipped_steps"; "" when none).
struct step_plan {
    bool log, save, evaluate, sample;
    enum plan_stop stop;
    const char *save_why;
    const char *ended;
};

// The plan for state s under config c. Rules (tests/unit/test_step_plan.c):
// - interrupted: only save (when saves and not yet saved) and stop with PLAN_SIGNAL;
// - too many skips (consecutive_skips >= max_skipped_steps): log, stop, no save;
// - log: the first step of a start, every log_every-th, a skipped one, the last;
// - save (saves only, never twice): the last step, a signal, exit_interval,
//   exit_duration (not on the last step), and every checkpoint_every-th step
//   unless it was skipped (it holds the last applied step's parameters, whose
//   checkpoint rotation would delete);
// - stop: a signal (also on the last step) before exit_interval before
//   exit_duration (neither on the last step) before completed (the last step);
//   a stop other than PLAN_COMPLETED skips evaluation and sample;
// - evaluate: has_val and every eval_every-th step or the last;
// - sample: has_sampler and every sample_every-th step or the last.
struct step_plan step_plan(const struct plan_config *c, const struct plan_state *s);

#endif
