/* What one peer may make this rank hold of point-to-point messages it has not asked for
 * (p2p_credit.c): the eager credit of a pair, and the announcements a receiver keeps. */
#ifndef HVDL_P2P_CREDIT_H
#define HVDL_P2P_CREDIT_H
#include <stddef.h>
#include <stdint.h>

/* The pair's budget, the same on every rank (agreed at start-up, config.h). */
typedef struct p2p_budget {
    int64_t eager;     /* charge of eager messages a receiver holds unmatched, at most */
    int64_t announced; /* charge of announcements (RTS) it holds unmatched, at most */
} p2p_budget_t;

/* One direction of a pair as each end sees it. */
typedef struct p2p_credit {
    /* The sender's side, under the peer's smu (p2p.c, p2p_rendezvous.c). */
    int64_t out;       /* charge of eager messages sent, not given back yet */
    int64_t ann_out;   /* charge of announcements sent, not answered (CTS, FIN) yet */
    int64_t ann_n;     /* how many announcements that is */
    /* The receiver's side, under the peer's rmu. */
    int64_t owed;      /* charge of eager messages arrived, not given back yet */
    int64_t back;      /* of owed: matched by a recv, to be given back */
    int64_t held;      /* charge of announcements held with no recv yet */
} p2p_credit_t;

/* The budget from HOROVODLIKE_P2P_UNEXPECTED_BYTES, HOROVODLIKE_P2P_ANNOUNCED_BYTES and the
 * eager threshold (room for two of the largest eager messages, whatever the first says). */
p2p_budget_t hvdl__credit_budget(int64_t unexpected, int64_t announced, int64_t eager_bytes,
                                 int64_t max_name);
/* What a message (eager: its payload counts; an announcement: nbytes 0) costs to hold. */
int64_t hvdl__credit_charge(int64_t name_len, int64_t nbytes);

/* Sender: 1 when an eager message of this charge fits the peer's credit (taken), 0 when it
 * must be announced instead (rendezvous). */
int hvdl__credit_take(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge);
/* Sender: 0 when one more announcement fits (counted), else -1 with why in msg. */
int hvdl__credit_announce(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge, char *msg,
                          size_t cap);
void hvdl__credit_answered(p2p_credit_t *c, int64_t charge); /* its CTS or FIN came */
/* Sender: the receiver gives n back (F_CREDIT): NULL, or what is wrong with it. */
const char *hvdl__credit_returned(p2p_credit_t *c, int64_t n);

/* Receiver: an eager message arrived: NULL, or what is wrong (past the peer's credit). */
const char *hvdl__credit_arrived(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge);
/* Receiver: an arrived eager message met its recv: what to give back now (F_CREDIT), or 0
 * while that is still under a quarter of the budget. */
int64_t hvdl__credit_matched(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge);
/* Receiver: an announcement is kept until its recv: NULL, or what is wrong (past the cap). */
const char *hvdl__credit_hold(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge);
void hvdl__credit_unhold(p2p_credit_t *c, int64_t charge); /* its recv came */

#endif
