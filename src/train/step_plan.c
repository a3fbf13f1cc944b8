// step_plan.c: the rules of the training loop (step_plan.h).
#include "step_plan.h"

static bool every(int step, int n) { return n > 0 && (step + 1) % n == 0; }

struct step_plan step_plan(const struct plan_config *c, const struct plan_state *s) {
    struct step_plan p = {.stop = PLAN_CONTINUE, .save_why = "", .ended = ""};
    if (s->interrupted) { // a stop during this step's evaluation or sample
        p.save = c->saves && !s->saved;
        if (p.save) p.save_why = "signal";
        p.stop = PLAN_SIGNAL, p.ended = "signal";
        return p;
    }
    bool last = s->step == c->steps - 1;
    p.log = last || every(s->step, c->log_every) || s->step == s->start_step || s->skipped;
    if (s->consecutive_skips >= c->max_skipped_steps) {
        p.stop = PLAN_TOO_MANY_SKIPS, p.ended = "max_skipped_steps";
        return p;
    }
    if (s->signal) p.stop = PLAN_SIGNAL, p.ended = "signal", p.save_why = "signal";
    else if (every(s->step, c->exit_interval) && !last)
        p.stop = PLAN_EXIT_INTERVAL, p.ended = "exit_interval", p.save_why = "exit_interval";
    else if (s->over_budget && !last)
        p.stop = PLAN_EXIT_DURATION, p.ended = "exit_duration", p.save_why = "exit_duration";
    else if (last) p.stop = PLAN_COMPLETED, p.ended = "completed", p.save_why = "last";
    // exit_interval on the last step: the run completes, saved as the last.
    // The periodic save waits for an applied step (see step_plan.h).
    if (!p.save_why[0] && every(s->step, c->checkpoint_every) && !s->skipped) p.save_why = "every";
    p.save = c->saves && !s->saved && p.save_why[0];
    if (!p.save) p.save_why = "";
    if (p.stop == PLAN_CONTINUE || p.stop == PLAN_COMPLETED) {
        p.evaluate = c->has_val && c->eval_every > 0 && (every(s->step, c->eval_every) || last);
        p.sample = c->has_sampler && c->sample_every > 0 && (every(s->step, c->sample_every) || last);
    }
    return p;
}
