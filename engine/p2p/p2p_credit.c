/*
 * What a peer can make this rank hold, bounded: the eager credit of each pair.
 *
 * An eager message travels whole, before its recv is posted, and a receiver must hold a
 * message whose recv is not posted yet until it is. Without a bound a sender (a loop whose
 * names do not match the receiver's, a slow receiver, a hostile peer) fills the receiver's
 * memory. So every (sender, receiver) pair has a budget B (HOROVODLIKE_P2P_UNEXPECTED_BYTES,
 * 4 MiB, and at least two of the largest eager messages) of what the receiver holds unasked:
 *
 *   1. Each message has a charge: its name and payload plus what holding it costs
 *      (CHARGE_OVERHEAD: the held entry and the allocator's headers). An announcement
 *      (RTS, no payload) is charged its name and the overhead.
 *   2. The sender counts the charge of the eager messages it sent and was not given back
 *      (out). A send whose charge fits (out + charge <= B) goes eager; one that does not
 *      is announced instead (RTS, the rendezvous path: p2p_rendezvous.c): its payload waits in the
 *      sender's buffer until the receiver posts the recv and clears it (CTS, or on one node
 *      reads it itself: RTSA, FIN). Deciding is an add and a compare at posting.
 *   3. The receiver counts the charge of the eager messages that arrived and were not given
 *      back (owed), checks owed + charge <= B on every arrival, and when a recv takes one
 *      adds its charge to back; once back reaches B/4 it gives it back in one F_CREDIT
 *      frame. An honest sender never breaks the check: owed = arrived - given back, and
 *      the sender's out = sent - given back it has read, with arrived <= sent and given back
 *      read <= given back, so owed <= out <= B. A peer that breaks it is reported as
 *      lost (a protocol error), so what it makes this rank hold of eager messages is at
 *      most B, in flight or matched included.
 *   4. Announcements are bounded by A (HOROVODLIKE_P2P_ANNOUNCED_BYTES, 64 MiB: about
 *      160,000 with short names). The sender counts those not answered yet (ann_out, from
 *      posting to its CTS or FIN); a send past A fails at once, naming the receiver and
 *      the knob, as a full unexpected queue does in MPI libraries that bound it. It must
 *      not wait instead: every later message to that peer would wait behind it, and a
 *      receiver waiting for one of those before posting the others would never get it.
 *      The receiver holds at most A of announcements (held <= ann_out, as in 3); past it
 *      the peer is reported.
 *
 * Deadlock. Posting never blocks: step 2 is a compare under the lock posting holds anyway,
 * and step 4 fails the send at once. Every message is announced in posting order, eager or
 * not: credit only decides whether the payload travels with the announcement or after its
 * recv, so the receiver finds every message sent to it, whole or announced, and matches
 * each recv it posts, in any order; an announcement met by its recv is answered without
 * credit (CTS, or the one-copy read and FIN). So every send and recv posted between two
 * ranks completes, in any order of posting, as they do on the rendezvous path alone. A
 * credit given back late only makes a message rendezvous that could have gone eager. What
 * changes: a blocking send (post, then wait) past the credit waits for its recv, as the
 * MPI standard lets MPI_Send do and as MPI libraries do past their eager buffer space; two
 * ranks that each block in sends to the other before either receives (what MPI calls an
 * unsafe program) complete only while less than B is unmatched between them.
 *
 * Cost model. A receiver that keeps up: no frame per message; one 88-byte F_CREDIT per B/4
 * of charge matched (default: one per 1 MiB: 32 messages of 32 KiB, about 2,600 of 8
 * bytes), and on one node the sender's p2p thread wakes to read it. A sender past its
 * credit: each message costs the rendezvous round trip (RTS then CTS and the payload; on
 * one node the RTSA, the receiver's one copy and the FIN) and completes only once its recv
 * is posted. Memory a receiver holds per sending peer: at most B of eager messages, A of
 * announcements and the reader's fixed state (its 64 KiB staging buffer); (size - 1) times
 * that across a job. The control frames a peer can make it queue (p2p_write.c) are bounded too:
 * a CTS or FIN per recv this rank posted, an ACK per ring piece with at most the ring's
 * slots not written yet (a piece beyond them is refused), an F_CREDIT per B/4 its recvs
 * took, a BELL per send it posted, a ROOM per mailbox drain, and one answer per ring and
 * mailbox offer (a second is refused).
 */
#include "p2p_credit.h"
#include <stdio.h>

/* The held entry (p2p_internal.h's pmsg_t, about 280 bytes), the name's and the payload's
 * allocations and the allocator's headers: what holding a message costs beyond its bytes. */
#define CHARGE_OVERHEAD 384

int64_t hvdl__credit_charge(int64_t name_len, int64_t nbytes) {
    return CHARGE_OVERHEAD + name_len + nbytes;
}

p2p_budget_t hvdl__credit_budget(int64_t unexpected, int64_t announced, int64_t eager_bytes,
                                 int64_t max_name) {
    int64_t two = 2 * hvdl__credit_charge(max_name, eager_bytes > 0 ? eager_bytes : 0);
    int64_t one = hvdl__credit_charge(max_name, 0);
    return (p2p_budget_t){.eager = unexpected > two ? unexpected : two,
                          .announced = announced > one ? announced : one};
}

int hvdl__credit_take(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge) {
    if (c->out + charge > b->eager) return 0;
    c->out += charge;
    return 1;
}

int hvdl__credit_announce(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge, char *msg,
                          size_t cap) {
    if (c->ann_out + charge <= b->announced) {
        c->ann_out += charge;
        c->ann_n++;
        return 0;
    }
    snprintf(msg, cap,
             "%lld messages to it are announced and not received yet (%lld bytes to hold, "
             "HOROVODLIKE_P2P_ANNOUNCED_BYTES=%lld): post their recvs on that rank first "
             "(are the names the same on both ranks?), or raise it on every rank",
             (long long)c->ann_n, (long long)c->ann_out, (long long)b->announced);
    return -1;
}

void hvdl__credit_answered(p2p_credit_t *c, int64_t charge) {
    c->ann_out -= charge;
    c->ann_n--;
}

const char *hvdl__credit_returned(p2p_credit_t *c, int64_t n) {
    if (n > c->out) return "credit given back that it was not given";
    c->out -= n;
    return NULL;
}

const char *hvdl__credit_arrived(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge) {
    if (c->owed + charge > b->eager)
        return "eager messages past its credit (HOROVODLIKE_P2P_UNEXPECTED_BYTES)";
    c->owed += charge;
    return NULL;
}

int64_t hvdl__credit_matched(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge) {
    c->back += charge;
    if (c->back < b->eager / 4) return 0;
    int64_t n = c->back;
    c->owed -= n;
    c->back = 0;
    return n;
}

const char *hvdl__credit_hold(p2p_credit_t *c, const p2p_budget_t *b, int64_t charge) {
    if (c->held + charge > b->announced)
        return "announcements past what it may have unmatched (HOROVODLIKE_P2P_ANNOUNCED_BYTES)";
    c->held += charge;
    return NULL;
}

void hvdl__credit_unhold(p2p_credit_t *c, int64_t charge) { c->held -= charge; }
