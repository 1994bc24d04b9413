/* Optional C accelerator of pipeloom's schedule core (private; pure-Python equivalents always exist).
 *
 * time_order()     THE timing kernel of pipeloom.sim.kernel (time a fixed per-device order), rule-free:
 *                  it reads pipeloom.core.rules as tables
 * run_pass()       the greedy pass of pipeloom.schedule.search.greedy, on the list-scheduling board below
 * proven_valid()   the validator's witness check (pipeloom.schedule.validate), see below
 * lockstep_pass()  the lock-step pass of pipeloom.schedule.search.lockstep, on the compiled form of the
 *                  list-scheduling board of pipeloom.sim.listsched (board_ready / board_commit, reading
 *                  the rule tables that time_order reads); board_replay() exposes the board to the tests
 * paced_pass()     the paced pass of pipeloom.schedule.search.paced on the same board (its own section)
 * template_pass()  the template pass of pipeloom.schedule.zb_looped on the same board (its own section)
 * vblock_squeeze(), vblock_squeeze_w()  the two squeezes of the building blocks (schedule/search/vsqueeze.py)
 *
 * run_pass() is greedy.GreedyPolicy on the list-scheduling loop (pipeloom.sim.listsched.run, the pure-Python
 * reference, which stays the specification), compiled on the same board as lockstep_pass: the rules come from
 * the tables only. The same decisions, the same floating-point operations in the same order (built with
 * -ffp-contract=off), and the same event order (a min-heap of (time, device) pairs with stale entries skipped,
 * as heapq): tests/schedule/test_accel.py checks identical job lists, orders, clocks and peaks.
 *
 * It exists for speed only: one pass over pp 64, m 512 (196 608 jobs) takes about 0.3 s in
 * Python and about 15 ms here. If the extension is not built, _greedy uses the Python pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double t;
    int d;
} HItem;

typedef struct {
    HItem *v;
    Py_ssize_t n, cap;
} Heap;

static inline int hless(HItem x, HItem y) { return x.t < y.t || (x.t == y.t && x.d < y.d); }

static void sift_down(Heap *h, Py_ssize_t start, Py_ssize_t pos) { /* heapq._siftdown(heap, start, pos) */
    HItem it = h->v[pos];
    while (pos > start) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (hless(it, h->v[parent])) {
            h->v[pos] = h->v[parent];
            pos = parent;
        } else {
            break;
        }
    }
    h->v[pos] = it;
}

static void sift_up(Heap *h, Py_ssize_t pos) { /* heapq._siftup(heap, pos) */
    Py_ssize_t end = h->n, start = pos;
    HItem it = h->v[pos];
    Py_ssize_t child = 2 * pos + 1;
    while (child < end) {
        Py_ssize_t right = child + 1;
        if (right < end && !hless(h->v[child], h->v[right])) child = right;
        h->v[pos] = h->v[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h->v[pos] = it;
    sift_down(h, start, pos); /* bubble it up from pos to start */
}

static int heap_push(Heap *h, HItem it) {
    if (h->n == h->cap) {
        Py_ssize_t nc = h->cap * 2 + 16;
        HItem *nv = realloc(h->v, (size_t)nc * sizeof(HItem));
        if (!nv) return -1;
        h->v = nv;
        h->cap = nc;
    }
    h->v[h->n++] = it;
    sift_down(h, 0, h->n - 1);
    return 0;
}

static HItem heap_pop(Heap *h) { /* caller checks n > 0 */
    HItem last = h->v[--h->n];
    if (h->n == 0) return last;
    HItem ret = h->v[0];
    h->v[0] = last;
    sift_up(h, 0);
    return ret;
}

static HItem heap_pushpop(Heap *h, HItem it) {
    if (h->n && hless(h->v[0], it)) {
        HItem ret = h->v[0];
        h->v[0] = it;
        sift_up(h, 0);
        return ret;
    }
    return it;
}

/* sequence of numbers -> freshly malloc'd C array of exactly n items (NULL + exception on error);
   one definition per element type: as_doubles (PyFloat_AsDouble) and as_longs (PyLong_AsLong) */
#define DEFINE_AS_ARRAY(NAME, TYPE, CONVERT)                                      \
    static TYPE *NAME(PyObject *seq, Py_ssize_t n, const char *what) {           \
        PyObject *fast = PySequence_Fast(seq, what);                              \
        if (!fast) return NULL;                                                   \
        if (PySequence_Fast_GET_SIZE(fast) != n) {                                \
            PyErr_Format(PyExc_ValueError, "%s: expected %zd values", what, n);   \
            Py_DECREF(fast);                                                      \
            return NULL;                                                          \
        }                                                                         \
        TYPE *out = malloc((size_t)(n ? n : 1) * sizeof(TYPE));                   \
        if (!out) {                                                               \
            Py_DECREF(fast);                                                      \
            PyErr_NoMemory();                                                     \
            return NULL;                                                          \
        }                                                                         \
        for (Py_ssize_t i = 0; i < n; i++) {                                      \
            out[i] = CONVERT(PySequence_Fast_GET_ITEM(fast, i));                  \
            if (out[i] == (TYPE)-1 && PyErr_Occurred()) {                         \
                free(out);                                                        \
                Py_DECREF(fast);                                                  \
                return NULL;                                                      \
            }                                                                     \
        }                                                                         \
        Py_DECREF(fast);                                                          \
        return out;                                                               \
    }

DEFINE_AS_ARRAY(as_doubles, double, PyFloat_AsDouble)
DEFINE_AS_ARRAY(as_longs, long, PyLong_AsLong)

static PyObject *list_of_doubles(const double *x, Py_ssize_t n) {
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(x[i]);
        if (!f) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, f);
    }
    return l;
}

/* ---------------------------------------------------------------- the rule tables
 * pipeloom.core.rules as pipeloom.sim.kernel.Rules hands them over: needs[slot] = ((event, chunk offset,
 * comm), ...), produces[slot] = (event, ...), slot = kind index * nc + chunk; read into CSR arrays
 * (the needs of slot s are nstart[s] .. nstart[s+1]-1, its events pstart[s] .. pstart[s+1]-1).
 * Every compiled engine (time_order, the list-scheduling board) reads the rules from here only.
 */
typedef struct {
    Py_ssize_t *nstart, *pstart;
    long *nev, *noff, *pev;
    double *ncm;
} RuleTab;

static void rules_free(RuleTab *rt) {
    free(rt->nstart); free(rt->pstart); free(rt->nev); free(rt->noff); free(rt->pev); free(rt->ncm);
    memset(rt, 0, sizeof(*rt));
}

/* 0 on success; -1 with an exception set (and nothing left allocated) */
static int rules_parse(PyObject *o_needs, PyObject *o_prod, Py_ssize_t nslot, RuleTab *rt) {
    Py_ssize_t *nstart = NULL, *pstart = NULL;
    long *nev = NULL, *noff = NULL, *pev = NULL;
    double *ncm = NULL;
    memset(rt, 0, sizeof(*rt));
    PyObject *fn = PySequence_Fast(o_needs, "needs"), *fp = PySequence_Fast(o_prod, "produces");
    if (!fn || !fp || PySequence_Fast_GET_SIZE(fn) != nslot || PySequence_Fast_GET_SIZE(fp) != nslot) {
        if (fn && fp) PyErr_SetString(PyExc_ValueError, "rules: needs/produces must have 4*nc entries");
        Py_XDECREF(fn);
        Py_XDECREF(fp);
        return -1;
    }
    nstart = calloc((size_t)nslot + 1, sizeof(Py_ssize_t));
    pstart = calloc((size_t)nslot + 1, sizeof(Py_ssize_t));
    int bad = !nstart || !pstart;
    for (Py_ssize_t s = 0; !bad && s < nslot; s++) {
        nstart[s + 1] = nstart[s] + PyObject_Length(PySequence_Fast_GET_ITEM(fn, s));
        pstart[s + 1] = pstart[s] + PyObject_Length(PySequence_Fast_GET_ITEM(fp, s));
        if (PyErr_Occurred()) bad = 1;
    }
    if (!bad) {
        nev = malloc((size_t)(nstart[nslot] + 1) * sizeof(long));
        noff = malloc((size_t)(nstart[nslot] + 1) * sizeof(long));
        ncm = malloc((size_t)(nstart[nslot] + 1) * sizeof(double));
        pev = malloc((size_t)(pstart[nslot] + 1) * sizeof(long));
        bad = !nev || !noff || !ncm || !pev;
        if (bad) PyErr_NoMemory();
    }
    for (Py_ssize_t s = 0; !bad && s < nslot; s++) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(fn, s), "needs row");
        if (!row) { bad = 1; break; }
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(row); j++) {
            PyObject *t = PySequence_Fast_GET_ITEM(row, j);
            Py_ssize_t q = nstart[s] + j;
            if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
                PyErr_SetString(PyExc_TypeError, "rules: a need is (event, offset, comm)");
                bad = 1;
                break;
            }
            nev[q] = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
            noff[q] = PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
            ncm[q] = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 2));
            if (PyErr_Occurred() || nev[q] < 0 || nev[q] > 2) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rules: event out of range");
                bad = 1;
                break;
            }
        }
        Py_DECREF(row);
        row = PySequence_Fast(PySequence_Fast_GET_ITEM(fp, s), "produces row");
        if (!row) { bad = 1; break; }
        for (Py_ssize_t j = 0; !bad && j < PySequence_Fast_GET_SIZE(row); j++) {
            long e = PyLong_AsLong(PySequence_Fast_GET_ITEM(row, j));
            if (PyErr_Occurred() || e < 0 || e > 2) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "rules: event out of range");
                bad = 1;
            }
            pev[pstart[s] + j] = e;
        }
        Py_DECREF(row);
    }
    Py_DECREF(fn);
    Py_DECREF(fp);
    if (bad) goto fail;
    rt->nstart = nstart, rt->pstart = pstart, rt->nev = nev, rt->noff = noff, rt->ncm = ncm, rt->pev = pev;
    return 0;
fail:
    free(nstart); free(pstart); free(nev); free(noff); free(pev); free(ncm);
    return -1;
}

/* ---------------------------------------------------------------- the list-scheduling board
 * The compiled form of pipeloom.sim.listsched.Board: a list schedule under construction, with the rules
 * read from the tables above (RuleTab), the per-slot durations (pipeloom.core.rules.durations) and memory
 * changes (pipeloom.core.rules.memory_delta). board_ready / board_arrival / board_commit are Board.ready /
 * Board.arrival / Board.commit with the same operations in the same order.
 */
typedef struct {
    RuleTab rt;
    Py_ssize_t pp, nc, m, mnc, per_dev;
    Py_ssize_t evs; /* the stride between the events' sections of done: m * nc and a few cache lines, so that
                       the same (mb, chunk) of two events does not fall on one cache set */
    double *dur, *dmem, *done, *free_t, *mem, *peak;
    long *dev, *cnt, *jmb, *jc;
    long *schunk; /* per slot: its chunk (slot % nc, looked up: no division in the hot loops) */
    Py_ssize_t *nkey, *pkey; /* per need / produced event of a slot: its place in done, less mb * nc */
    Py_ssize_t *pbeg; /* the produced events some job needs (the only ones written): pkey[pbeg[s] .. pbeg[s+1]-1] */
    Py_ssize_t *k01; /* per slot: nkey of its first two needs (the common case read without the CSR loop) */
    double *c01;     /* per slot: their comm */
    unsigned char *jk, *skind; /* skind per slot: its kind index (slot / nc) */
} Board;

static void board_free(Board *b) {
    rules_free(&b->rt);
    free(b->dur); free(b->dmem); free(b->done); free(b->free_t); free(b->mem); free(b->peak);
    free(b->dev); free(b->cnt); free(b->jmb); free(b->jc); free(b->jk); free(b->schunk); free(b->skind);
    free(b->nkey); free(b->pkey); free(b->pbeg); free(b->k01); free(b->c01);
}

/* 0, or -1 with an exception set (call board_free either way) */
static int board_init(Board *b, Py_ssize_t pp, Py_ssize_t nc, Py_ssize_t m, Py_ssize_t per_dev, PyObject *o_needs,
                      PyObject *o_prod, PyObject *o_dur, PyObject *o_dmem, PyObject *o_dev) {
    memset(b, 0, sizeof(*b));
    b->pp = pp, b->nc = nc, b->m = m, b->mnc = m * nc, b->per_dev = per_dev, b->evs = m * nc + 40;
    const Py_ssize_t nslot = 4 * nc;
    if (rules_parse(o_needs, o_prod, nslot, &b->rt) < 0) return -1;
    if (!(b->dur = as_doubles(o_dur, nslot, "durations")) || !(b->dmem = as_doubles(o_dmem, nslot, "memory deltas")) ||
        !(b->dev = as_longs(o_dev, nc, "dev")))
        return -1;
    for (Py_ssize_t s = 0; s < nslot; s++) {
        for (Py_ssize_t q = b->rt.nstart[s]; q < b->rt.nstart[s + 1]; q++) {
            long c2 = (long)(s % nc) + b->rt.noff[q];
            if (c2 < 0 || c2 >= nc) {
                PyErr_SetString(PyExc_ValueError, "board: a need points outside the chunks");
                return -1;
            }
        }
    }
    b->done = malloc((size_t)(3 * b->evs) * sizeof(double));
    b->free_t = calloc((size_t)pp, sizeof(double));
    b->mem = calloc((size_t)pp, sizeof(double));
    b->peak = calloc((size_t)pp, sizeof(double));
    b->cnt = calloc((size_t)pp, sizeof(long));
    b->jmb = malloc((size_t)(pp * per_dev) * sizeof(long));
    b->jc = malloc((size_t)(pp * per_dev) * sizeof(long));
    b->jk = malloc((size_t)(pp * per_dev));
    b->schunk = malloc((size_t)nslot * sizeof(long));
    b->skind = malloc((size_t)nslot);
    if (!b->done || !b->free_t || !b->mem || !b->peak || !b->cnt || !b->jmb || !b->jc || !b->jk || !b->schunk ||
        !b->skind) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < nslot; s++) {
        b->schunk[s] = (long)(s % nc);
        b->skind[s] = (unsigned char)(s / nc);
    }
    b->nkey = malloc((size_t)(b->rt.nstart[nslot] + 1) * sizeof(Py_ssize_t));
    b->pkey = malloc((size_t)(b->rt.pstart[nslot] + 1) * sizeof(Py_ssize_t));
    b->pbeg = malloc((size_t)(nslot + 1) * sizeof(Py_ssize_t));
    b->k01 = calloc((size_t)nslot * 2, sizeof(Py_ssize_t));
    b->c01 = calloc((size_t)nslot * 2, sizeof(double));
    if (!b->nkey || !b->pkey || !b->pbeg || !b->k01 || !b->c01) {
        PyErr_NoMemory();
        return -1;
    }
    int needed[3] = {0, 0, 0}; /* an event no job needs (WGRAD) is not recorded: nothing reads it */
    for (Py_ssize_t q = 0; q < b->rt.nstart[nslot]; q++) needed[b->rt.nev[q]] = 1;
    Py_ssize_t np = 0;
    for (Py_ssize_t s = 0; s < nslot; s++) {
        for (Py_ssize_t q = b->rt.nstart[s]; q < b->rt.nstart[s + 1]; q++)
            b->nkey[q] = b->rt.nev[q] * b->evs + (s % nc + b->rt.noff[q]) * m;
        b->pbeg[s] = np;
        for (Py_ssize_t q = b->rt.pstart[s]; q < b->rt.pstart[s + 1]; q++)
            if (needed[b->rt.pev[q]]) b->pkey[np++] = b->rt.pev[q] * b->evs + (s % nc) * m;
    }
    b->pbeg[nslot] = np;
    for (Py_ssize_t s = 0; s < nslot; s++)
        for (Py_ssize_t q = b->rt.nstart[s], h = 0; q < b->rt.nstart[s + 1] && h < 2; q++, h++) {
            b->k01[2 * s + h] = b->nkey[q];
            b->c01[2 * s + h] = b->rt.ncm[q];
        }
    for (Py_ssize_t q = 0; q < 3 * b->evs; q++) b->done[q] = -1.0;
    return 0;
}

/* when event ev of (mb, c) happened, -1.0 while it has not (Board.done; here chunk-major, ev * mnc + c * m + mb:
   a device runs a chunk's microbatches in turn, so its reads and writes stay close in memory) */
static inline double board_event(const Board *b, long ev, long mb, long c) {
    return b->done[ev * b->evs + (Py_ssize_t)c * b->m + mb];
}

/* Board.ready: when the inputs of job `slot` of `mb` are on its device; -1.0 while one is missing */
static inline double board_ready(const Board *b, long slot, long mb) {
    const Py_ssize_t at = mb;
    const Py_ssize_t q0 = b->rt.nstart[slot], q1 = b->rt.nstart[slot + 1];
    double r = 0.0;
    if (q1 - q0 == 2) { /* the operations of the loop below (both loads issued at once) */
        double e0 = b->done[b->k01[2 * slot] + at], e1 = b->done[b->k01[2 * slot + 1] + at];
        if (e0 < 0 || e1 < 0) return -1.0;
        e0 += b->c01[2 * slot];
        if (e0 > r) r = e0;
        e1 += b->c01[2 * slot + 1];
        if (e1 > r) r = e1;
        return r;
    }
    if (q1 - q0 == 1) {
        double e0 = b->done[b->k01[2 * slot] + at];
        if (e0 < 0) return -1.0;
        e0 += b->c01[2 * slot];
        return e0 > r ? e0 : r;
    }
    for (Py_ssize_t q = q0; q < q1; q++) {
        double e = b->done[b->nkey[q] + at];
        if (e < 0) return -1.0;
        e += b->rt.ncm[q];
        if (e > r) r = e;
    }
    return r;
}

/* Board.arrival: 1 and *out = when the input from another device arrives; 0 when there is none (yet) */
static inline int board_arrival(const Board *b, long slot, long mb, double *out) {
    const long c = b->schunk[slot];
    for (Py_ssize_t q = b->rt.nstart[slot]; q < b->rt.nstart[slot + 1]; q++) {
        long off = b->rt.noff[q];
        if (off && b->dev[c + off] != b->dev[c]) {
            double e = board_event(b, b->rt.nev[q], mb, c + off);
            if (e < 0) return 0;
            *out = e + b->rt.ncm[q];
            return 1;
        }
    }
    return 0;
}

/* Board.commit: job `slot` of `mb` runs on device d from `start`; its end (-1.0 + exception: no room) */
static inline double board_commit(Board *b, long d, long slot, long mb, double start) {
    const long c = b->schunk[slot];
    double e = start + b->dur[slot];
    const Py_ssize_t at = mb;
    for (Py_ssize_t q = b->pbeg[slot]; q < b->pbeg[slot + 1]; q++) b->done[b->pkey[q] + at] = e;
    double md = b->mem[d] + b->dmem[slot];
    b->mem[d] = md;
    if (md > b->peak[d]) b->peak[d] = md;
    if (b->cnt[d] >= b->per_dev) {
        PyErr_SetString(PyExc_RuntimeError, "internal error: device job overflow");
        return -1.0;
    }
    Py_ssize_t k = (Py_ssize_t)d * b->per_dev + b->cnt[d];
    b->jk[k] = b->skind[slot];
    b->jmb[k] = mb;
    b->jc[k] = c;
    b->cnt[d] += 1;
    b->free_t[d] = e;
    return e;
}

/* the placed jobs as per-device lists of job_type(kinds[k], mb, chunk) (NULL + exception on error) */
/* The rules' handoff table (pipeloom.sim.listsched.handoff_table), read for every pass on the board: per slot
   None, or (chunk offset, comm) of the edge on which the job's event goes to another chunk. *hoff: the offset, 0
   for none (an edge never stays on its chunk); *hcm: its comm. 0, or -1 with an exception set (the caller frees
   both arrays). */
static int parse_handoff(PyObject *o_hand, Py_ssize_t nc, long **hoff, double **hcm) {
    *hoff = calloc((size_t)4 * nc, sizeof(long));
    *hcm = calloc((size_t)4 * nc, sizeof(double));
    if (!*hoff || !*hcm) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *fh = PySequence_Fast(o_hand, "handoff");
    if (!fh) return -1;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(fh) != 4 * nc) {
        PyErr_SetString(PyExc_ValueError, "handoff: expected 4*nc entries");
        goto out;
    }
    for (Py_ssize_t s = 0; s < 4 * nc; s++) {
        PyObject *h = PySequence_Fast_GET_ITEM(fh, s);
        if (h == Py_None) continue;
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
            PyErr_SetString(PyExc_TypeError, "handoff: an edge is (chunk offset, comm) or None");
            goto out;
        }
        (*hoff)[s] = PyLong_AsLong(PyTuple_GET_ITEM(h, 0));
        (*hcm)[s] = PyFloat_AsDouble(PyTuple_GET_ITEM(h, 1));
        if (PyErr_Occurred()) goto out;
        long c2 = (long)(s % nc) + (*hoff)[s];
        if (!(*hoff)[s] || c2 < 0 || c2 >= nc) {
            PyErr_SetString(PyExc_ValueError, "handoff: an edge points outside the chunks");
            goto out;
        }
    }
    rc = 0;
out:
    Py_DECREF(fh);
    return rc;
}

/* The Job type and kinds every pass builds its job lists with: job_type a tuple subclass, kinds an nk-tuple.
   0, or -1 with a TypeError naming the pass. */
static int check_job_args(PyObject *job_type, PyObject *kinds, Py_ssize_t nk, const char *who) {
    if (!PyType_Check(job_type) || !PyType_IsSubtype((PyTypeObject *)job_type, &PyTuple_Type) ||
        !PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != nk) {
        PyErr_Format(PyExc_TypeError, "%s: job_type must be a tuple subclass, kinds a %zd-tuple", who, nk);
        return -1;
    }
    return 0;
}

static PyObject *board_seqs(const Board *b, PyObject *job_type, PyObject *kinds) {
    Py_ssize_t nints = (b->m > b->nc ? b->m : b->nc) + 1;
    PyObject **ints = calloc((size_t)nints, sizeof(PyObject *));
    PyObject *seqs = NULL;
    if (!ints) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < nints; i++)
        if (!(ints[i] = PyLong_FromSsize_t(i))) goto done;
    PyTypeObject *jt = (PyTypeObject *)job_type;
    if (!(seqs = PyList_New(b->pp))) goto done;
    for (Py_ssize_t d = 0; d < b->pp; d++) {
        PyObject *lst = PyList_New(b->cnt[d]);
        if (!lst) {
            Py_CLEAR(seqs);
            goto done;
        }
        PyList_SET_ITEM(seqs, d, lst);
        for (Py_ssize_t i = 0; i < b->cnt[d]; i++) {
            Py_ssize_t at = d * b->per_dev + i;
            PyObject *job = jt->tp_alloc(jt, 3);
            if (!job) {
                Py_CLEAR(seqs);
                goto done;
            }
            PyObject *k = PyTuple_GET_ITEM(kinds, b->jk[at]);
            Py_INCREF(k);
            Py_INCREF(ints[b->jmb[at]]);
            Py_INCREF(ints[b->jc[at]]);
            PyTuple_SET_ITEM(job, 0, k);
            PyTuple_SET_ITEM(job, 1, ints[b->jmb[at]]);
            PyTuple_SET_ITEM(job, 2, ints[b->jc[at]]);
            PyObject_GC_UnTrack(job); /* (Kind, int, int) closes no cycle: see run_pass */
            PyList_SET_ITEM(lst, i, job);
        }
    }
done:
    for (Py_ssize_t i = 0; i < nints; i++) Py_XDECREF(ints[i]);
    free(ints);
    return seqs;
}

/* run_pass(shape, board_tables, device_arrays, policy, job_type, kinds)
 *   shape        = (pp, vpp, m, limit, eps)
 *   board_tables = (needs, produces, durations, dmem, dev, handoff): the list-scheduling board's tables, as
 *                  pipeloom.sim.listsched.Board reads them: pipeloom.sim.kernel.Rules needs / produces, per slot
 *                  the duration (kernel.duration_table) and memory change (listsched.mem_table), per chunk its
 *                  device, per slot the edge its handoff travels, (chunk offset, comm) or None
 *                  (listsched.handoff_table)
 *   device_arrays= (first, capd, need, bord, ford)                       bord/ford: pp*vpp chunks
 *   policy       = (reserve, b_first, fill_always, lookahead, h_warm, warmup or -1)
 * -> None on deadlock, else (seqs, order_bytes, t, peak, start0)
 *
 * The greedy pass: greedy.GreedyPolicy on the loop of pipeloom.sim.listsched.run, compiled, on the compiled
 * board (readiness board_ready, memory b.mem / b.dmem, commit board_commit: the rules come from the tables
 * only, as in the Python pass). What stays here is the policy's own state (per chunk the next F and B
 * microbatch, per device its W queue, forwards before its first B, the reservation) and the loop's heap.
 * The same decisions, the same floating-point operations in the same order (built with -ffp-contract=off)
 * and the same event order (a min-heap of (time, device) pairs with stale entries skipped, as heapq):
 * tests/schedule/test_accel.py checks identical job lists, orders, clocks and peaks, and
 * tests/sim/test_listsched.py that a mutated rule reaches this pass as it reaches the Python one.
 *
 * Speed (within 0-3% of the former transcription with its own per-chunk readiness: medians of paired CPU
 * times, pp 64 vpp 2 m 512 and pp 32 vpp 4 m 256): the board's accessors are inlined (flatten), and rdy[]
 * keeps per F/B slot the ready time of the chunk's next microbatch once every input is placed (an event is
 * written once, so it cannot change; cleared when the cursor moves on), so a candidate waiting for the device
 * is not re-read at every decision point. (Also tried, slower: heap operations out of line; a "waiting" mark
 * per slot cleared by the commits that feed it.)
 */
__attribute__((flatten)) static PyObject *run_pass(PyObject *self, PyObject *args) {
    (void)self;
    int pp, vpp, m;
    double limit, eps;
    PyObject *o_needs, *o_prod, *o_dur, *o_dmem, *o_dev, *o_hand;
    PyObject *o_first, *o_capd, *o_need, *o_bord, *o_ford;
    int reserve, b_first, fill_always, h_warm, warm;
    double look;
    PyObject *job_type, *kinds;
    if (!PyArg_ParseTuple(args, "(iiidd)(OOOOOO)(OOOOO)(pppdpi)OO", &pp, &vpp, &m, &limit, &eps, &o_needs, &o_prod,
                          &o_dur, &o_dmem, &o_dev, &o_hand, &o_first, &o_capd, &o_need, &o_bord, &o_ford, &reserve,
                          &b_first, &fill_always, &look, &h_warm, &warm, &job_type, &kinds))
        return NULL;
    if (check_job_args(job_type, kinds, 3, "run_pass") < 0) return NULL;
    if (pp < 1 || vpp < 1 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "pp, vpp and m must be >= 1");
        return NULL;
    }
    const Py_ssize_t nc = (Py_ssize_t)pp * vpp;
    const Py_ssize_t per_dev = 3 * (Py_ssize_t)m * vpp; /* jobs each device runs */
    const Py_ssize_t total = per_dev * pp;
    const long sF = 0, sB = (long)nc, sW = 2 * (long)nc; /* slots: kind index (F 0, B 1, W 2) * nc + chunk */
    const double INF = HUGE_VAL;

    Board b;
    memset(&b, 0, sizeof(b));
    PyObject *result = NULL;
    double *capd = NULL, *need = NULL, *resv = NULL, *key = NULL, *start0 = NULL, *hcm = NULL, *rdy = NULL;
    long *first = NULL, *bord = NULL, *ford = NULL, *hoff = NULL;
    long *nf = NULL, *nb = NULL, *nfwd = NULL, *started_b = NULL, *pend_mb = NULL, *pend_c = NULL, *ph = NULL,
         *pt = NULL;
    int64_t *ord = NULL;
    Heap heap = {NULL, 0, 0};

    if (board_init(&b, pp, nc, m, per_dev, o_needs, o_prod, o_dur, o_dmem, o_dev) < 0) goto done;
    if (!(first = as_longs(o_first, pp, "first")) || !(capd = as_doubles(o_capd, pp, "capd")) ||
        !(need = as_doubles(o_need, pp, "need")) || !(bord = as_longs(o_bord, nc, "bord")) ||
        !(ford = as_longs(o_ford, nc, "ford")))
        goto done;
    for (Py_ssize_t i = 0; i < nc; i++) {
        if (b.dev[i] < 0 || b.dev[i] >= pp || bord[i] < 0 || bord[i] >= nc || ford[i] < 0 || ford[i] >= nc) {
            PyErr_SetString(PyExc_ValueError, "device or chunk index out of range");
            goto done;
        }
    }
    /* None, or (chunk offset, comm): the edge the job's event travels */
    if (parse_handoff(o_hand, nc, &hoff, &hcm) < 0) goto done;
    resv = calloc((size_t)pp, sizeof(double));
    rdy = malloc((size_t)2 * nc * sizeof(double));
    key = calloc((size_t)pp, sizeof(double));
    start0 = calloc((size_t)pp, sizeof(double));
    nf = calloc((size_t)nc, sizeof(long));
    nb = calloc((size_t)nc, sizeof(long));
    nfwd = calloc((size_t)pp, sizeof(long));
    started_b = calloc((size_t)pp, sizeof(long));
    pend_mb = malloc((size_t)pp * m * vpp * sizeof(long));
    pend_c = malloc((size_t)pp * m * vpp * sizeof(long));
    ph = calloc((size_t)pp, sizeof(long));
    pt = calloc((size_t)pp, sizeof(long));
    ord = malloc((size_t)total * sizeof(int64_t));
    heap.cap = pp + 16;
    heap.v = malloc((size_t)heap.cap * sizeof(HItem));
    if (!resv || !rdy || !key || !start0 || !nf || !nb || !nfwd || !started_b || !pend_mb || !pend_c || !ph || !pt || !ord ||
        !heap.v) {
        PyErr_NoMemory();
        goto done;
    }
    for (int d = 0; d < pp; d++) {
        heap.v[d].t = 0.0;
        heap.v[d].d = d;
    }
    heap.n = pp; /* sorted by device at time 0: already a heap */
    for (Py_ssize_t s = 0; s < 2 * nc; s++) rdy[s] = -1.0;

    const double *dur = b.dur, *dmem = b.dmem;
    double *mem = b.mem, *free_t = b.free_t;
    const long *dev = b.dev;
    Py_ssize_t ncommit = 0;
    HItem item = heap_pop(&heap);
    for (;;) {
        double T = item.t;
        int d = item.d;
        if (T != key[d]) {
            if (!heap.n) break;
            item = heap_pop(&heap);
            continue;
        }
        /* ---- backward candidates */
        long bc = -1;
        double rb = INF;
        const long *bo = bord + (Py_ssize_t)d * vpp;
        for (int j = 0; j < vpp; j++) {
            long c = bo[j];
            long mb = nb[c];
            if (mb >= nf[c]) continue;
            double r = rdy[sB + c];
            if (r < 0) {
                r = board_ready(&b, sB + c, mb);
                if (r < 0) continue;
                rdy[sB + c] = r;
            }
            if (r <= T) {
                bc = c;
                break;
            }
            if (r < rb) rb = r;
        }
        /* ---- forward candidates */
        long fc = -1;
        double rf = INF;
        int blocked = 0;
        if (bc < 0 || !b_first) {
            double md = mem[d];
            const long *fo = ford + (Py_ssize_t)d * vpp;
            for (int j = 0; j < vpp; j++) {
                long c = fo[j];
                long mb = nf[c];
                if (mb >= m) continue;
                double r = rdy[sF + c];
                if (r < 0) {
                    r = board_ready(&b, sF + c, mb);
                    if (r < 0) continue;
                    rdy[sF + c] = r;
                }
                double ac = dmem[sF + c];
                int ok;
                if (c == first[d]) {
                    if (warm >= 0 && !started_b[d] && nfwd[d] >= warm) continue;
                    if (reserve)
                        ok = resv[d] + need[d] <= limit;
                    else
                        ok = md + ac <= ((!h_warm || !started_b[d]) ? capd[d] : limit);
                } else {
                    ok = reserve || md + ac <= limit;
                }
                if (!ok) {
                    if (r <= T) blocked = 1;
                    continue;
                }
                if (r <= T) {
                    fc = c;
                    break;
                }
                if (r < rf) rf = r;
            }
        }
        int kind = -1;
        long c = -1;
        if (bc >= 0 && (b_first || fc < 0)) {
            kind = 1;
            c = bc;
        } else if (fc >= 0) {
            if (look > 0.0 && rb - T < look * dur[sF + fc])
                rf = INF; /* hold the device for the coming B */
            else {
                kind = 0;
                c = fc;
            }
        }
        if (kind < 0) {
            int pw = ph[d] < pt[d];
            double nxt = rb < rf ? rb : rf;
            if (pw && (blocked || fill_always || nxt == INF ||
                       nxt - T >= dur[sW + pend_c[(Py_ssize_t)d * m * vpp + ph[d]]] - eps)) {
                kind = 2;
            } else if (nxt < INF && nxt > T) {
                key[d] = nxt;
                HItem hi = {nxt, d};
                item = heap_pushpop(&heap, hi);
                continue;
            } else if (pw) {
                kind = 2;
            } else {
                key[d] = INF; /* sleep until a dependency is scheduled */
                if (!heap.n) break;
                item = heap_pop(&heap);
                continue;
            }
        }
        /* ---- the chosen job: the policy's counters, then the board commits it */
        long mb, slot;
        if (kind == 0) {
            mb = nf[c];
            nf[c] = mb + 1;
            slot = sF + c;
            rdy[slot] = -1.0;
            if (reserve && c == first[d]) resv[d] += need[d];
            if (!started_b[d]) nfwd[d] += 1;
        } else if (kind == 1) {
            mb = nb[c];
            nb[c] = mb + 1;
            slot = sB + c;
            rdy[slot] = -1.0;
            resv[d] += dmem[slot];
            started_b[d] = 1;
            Py_ssize_t q = (Py_ssize_t)d * m * vpp + pt[d];
            if (pt[d] >= (long)m * vpp) {
                PyErr_SetString(PyExc_RuntimeError, "internal error: W queue overflow");
                goto done;
            }
            pend_mb[q] = mb;
            pend_c[q] = c;
            pt[d] += 1;
        } else {
            Py_ssize_t q = (Py_ssize_t)d * m * vpp + ph[d];
            mb = pend_mb[q];
            c = pend_c[q];
            ph[d] += 1;
            slot = sW + c;
            resv[d] += dmem[slot];
        }
        double e = board_commit(&b, d, slot, mb, T);
        if (e < 0 && PyErr_Occurred()) goto done;
        if (b.cnt[d] == 1) start0[d] = T;
        ord[(Py_ssize_t)d * per_dev + b.cnt[d] - 1] = ncommit;
        ncommit += 1;
        if (hoff[slot]) { /* the loop's fed(): the receiving device decides again when the input arrives */
            int d2 = (int)dev[c + hoff[slot]];
            if (d2 != d) {
                double k = e + hcm[slot];
                if (free_t[d2] > k) k = free_t[d2];
                if (k < key[d2]) {
                    key[d2] = k;
                    HItem hi = {k, d2};
                    if (heap_push(&heap, hi) < 0) {
                        PyErr_NoMemory();
                        goto done;
                    }
                }
            }
        }
        key[d] = e;
        HItem hi = {e, d};
        item = heap_pushpop(&heap, hi);
    }
    if (ncommit != total) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* ---- (seqs, order_bytes, t, peak, start0); jobs are job_type(kind, mb, chunk) tuples */
    PyObject *seqs = board_seqs(&b, job_type, kinds);
    if (!seqs) goto done;
    PyObject *ob = PyBytes_FromStringAndSize((const char *)ord, (Py_ssize_t)(total * sizeof(int64_t)));
    PyObject *lt = list_of_doubles(free_t, pp), *lp = list_of_doubles(b.peak, pp), *ls = list_of_doubles(start0, pp);
    if (!ob || !lt || !lp || !ls) {
        Py_XDECREF(ob);
        Py_XDECREF(lt);
        Py_XDECREF(lp);
        Py_XDECREF(ls);
        Py_DECREF(seqs);
        goto done;
    }
    result = Py_BuildValue("(NNNNN)", seqs, ob, lt, lp, ls);

done:
    board_free(&b);
    free(capd); free(need); free(resv); free(rdy); free(key); free(start0); free(hcm);
    free(first); free(bord); free(ford); free(hoff);
    free(nf); free(nb); free(nfwd); free(started_b); free(pend_mb); free(pend_c); free(ph); free(pt);
    free(ord); free(heap.v);
    return result;
}
/* ---------------------------------------------------------------- witness check
 * proven_valid(devices, witness, shape, home, kinds, needs, produces, dmem, limit) -> bool
 *   devices = per device a sequence of (kind, mb, chunk) tuples; witness = per device a sequence of
 *   int ranks (or an int64 buffer); shape = (pp, vpp, m); home[c] = device of chunk c;
 *   kinds = (F, B, W, BW) objects (compared by identity); needs, produces = the rule tables
 *   (pipeloom.sim.kernel.Rules); dmem = per slot the memory change (pipeloom.sim.listsched.mem_table);
 *   limit = float or None (no memory check).
 * True only if: every job is in range and on its home device; each (mb, chunk) has one F and
 * either B and W or one BW, nothing twice; every event a job needs (the needs table: F(mb,c-1) -> F(mb,c);
 * F(mb,c) and the input grad of (mb,c+1) -> B/BW(mb,c); B -> W) was completed by a job of lower rank; ranks rise
 * strictly along each device's list (so no deadlock is possible); the running memory of each
 * device (its dmem summed in list order, as memory_profile does) never exceeds limit + 1e-9.
 * Anything else, including an unexpected object, gives False (the caller then runs the
 * job-by-job checks, which produce the messages).
 */
static int rank_at(PyObject *w, Py_buffer *buf, int is_buf, Py_ssize_t i, long long *out) {
    if (is_buf) {
        *out = ((const long long *)buf->buf)[i];
        return 0;
    }
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(w, i));
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *proven_valid(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *devices, *witness, *o_home, *kinds, *o_needs, *o_prod, *o_dmem, *o_limit;
    int pp, vpp, m;
    if (!PyArg_ParseTuple(args, "OO(iii)OOOOOO", &devices, &witness, &pp, &vpp, &m, &o_home, &kinds, &o_needs,
                          &o_prod, &o_dmem, &o_limit))
        return NULL;
    if (pp < 1 || vpp < 1 || m < 1 || !PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 4) Py_RETURN_FALSE;
    const Py_ssize_t nc = (Py_ssize_t)pp * vpp, mnc = nc * m;
    int check_mem = o_limit != Py_None;
    double limit = 0.0;
    if (check_mem) {
        limit = PyFloat_AsDouble(o_limit);
        if (limit == -1.0 && PyErr_Occurred()) return NULL;
        limit += 1e-9;
    }
    int ok = 0;
    long *home = NULL;
    double *dmem = NULL;
    long long *rk = NULL, *erk = NULL;
    PyObject *devs = NULL, *wits = NULL;
    RuleTab rt;
    memset(&rt, 0, sizeof(rt));
    if (!(home = as_longs(o_home, nc, "home")) || !(dmem = as_doubles(o_dmem, 4 * nc, "dmem")) ||
        rules_parse(o_needs, o_prod, 4 * nc, &rt) < 0)
        goto fail;
    for (Py_ssize_t sl = 0; sl < 4 * nc; sl++)
        for (Py_ssize_t q = rt.nstart[sl]; q < rt.nstart[sl + 1]; q++)
            if (sl % nc + rt.noff[q] < 0 || sl % nc + rt.noff[q] >= nc) goto done;
    devs = PySequence_Fast(devices, "devices");
    wits = PySequence_Fast(witness, "witness");
    if (!devs || !wits) goto fail;
    if (PySequence_Fast_GET_SIZE(devs) != pp || PySequence_Fast_GET_SIZE(wits) != pp) goto done;
    if (check_mem && 0.0 > limit) goto done;
    rk = malloc((size_t)4 * mnc * sizeof(long long)); /* ranks of F, B, W, BW per (mb, chunk); -1 = absent */
    erk = malloc((size_t)3 * mnc * sizeof(long long)); /* rank of the job that completes each event; -1: none */
    if (!rk || !erk) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < 4 * mnc; i++) rk[i] = -1;
    for (Py_ssize_t i = 0; i < 3 * mnc; i++) erk[i] = -1;
    PyObject *kF = PyTuple_GET_ITEM(kinds, 0), *kB = PyTuple_GET_ITEM(kinds, 1), *kW = PyTuple_GET_ITEM(kinds, 2),
             *kBW = PyTuple_GET_ITEM(kinds, 3);
    for (int d = 0; d < pp; d++) {
        PyObject *seq = PySequence_Fast(PySequence_Fast_GET_ITEM(devs, d), "device list");
        if (!seq) goto fail;
        PyObject *wd = PySequence_Fast_GET_ITEM(wits, d);
        Py_buffer buf;
        int is_buf = 0;
        PyObject *wseq = NULL;
        if (PyObject_CheckBuffer(wd) && PyObject_GetBuffer(wd, &buf, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            is_buf = 1;
            const char *f = buf.format ? buf.format : "B";
            if (*f == '@' || *f == '=' || *f == '<') f++;
            if (buf.itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
                PyBuffer_Release(&buf);
                Py_DECREF(seq);
                goto done;
            }
        } else {
            PyErr_Clear();
            wseq = PySequence_Fast(wd, "witness list");
            if (!wseq) {
                PyErr_Clear();
                Py_DECREF(seq);
                goto done;
            }
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t wn = is_buf ? buf.len / 8 : PySequence_Fast_GET_SIZE(wseq);
        int good = wn == n;
        long long prev = -1;
        double cur = 0.0;
        for (Py_ssize_t i = 0; good && i < n; i++) {
            PyObject *job = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyTuple_Check(job) || PyTuple_GET_SIZE(job) != 3) {
                good = 0;
                break;
            }
            PyObject *k = PyTuple_GET_ITEM(job, 0);
            int ki = k == kF ? 0 : k == kB ? 1 : k == kW ? 2 : k == kBW ? 3 : -1;
            long mb = PyLong_AsLong(PyTuple_GET_ITEM(job, 1));
            long c = PyLong_AsLong(PyTuple_GET_ITEM(job, 2));
            if (PyErr_Occurred()) {
                PyErr_Clear();
                good = 0;
                break;
            }
            long long r;
            if (ki < 0 || mb < 0 || mb >= m || c < 0 || c >= nc || home[c] != d ||
                rank_at(wseq, &buf, is_buf, i, &r) < 0 || r <= prev) {
                good = 0;
                break;
            }
            prev = r;
            Py_ssize_t slot = (Py_ssize_t)ki * mnc + (Py_ssize_t)mb * nc + c;
            if (rk[slot] != -1) {
                good = 0;
                break;
            }
            rk[slot] = r;
            for (Py_ssize_t q = rt.pstart[ki * nc + c]; q < rt.pstart[ki * nc + c + 1]; q++)
                erk[rt.pev[q] * mnc + (Py_ssize_t)mb * nc + c] = r;
            if (check_mem) { /* the memory rule: core.rules.memory_delta as the board's table */
                cur += dmem[ki * nc + c];
                if (cur > limit) good = 0;
            }
        }
        if (is_buf) PyBuffer_Release(&buf);
        Py_XDECREF(wseq);
        Py_DECREF(seq);
        if (!good) goto done;
    }
    const long long *rF = rk, *rB = rk + mnc, *rW = rk + 2 * mnc, *rBW = rk + 3 * mnc;
    for (Py_ssize_t s = 0; s < mnc; s++) { /* every (mb, chunk) runs F and either B and W or BW */
        if (rF[s] < 0) goto done;
        int split = rB[s] >= 0;
        if (split ? (rW[s] < 0 || rBW[s] >= 0) : (rBW[s] < 0 || rW[s] >= 0)) goto done;
    }
    for (Py_ssize_t ki = 0; ki < 4; ki++) { /* the dependency rule (core.rules.needs as tables): every event a job
                                               needs was completed by a job of lower rank */
        for (Py_ssize_t s = 0; s < mnc; s++) {
            long long r = rk[ki * mnc + s];
            if (r < 0) continue;
            Py_ssize_t c = s % nc, sl = ki * nc + c;
            for (Py_ssize_t q = rt.nstart[sl]; q < rt.nstart[sl + 1]; q++) {
                long long e = erk[rt.nev[q] * mnc + s + rt.noff[q]];
                if (e < 0 || e >= r) goto done;
            }
        }
    }
    ok = 1;
done:
    free(home); free(dmem); free(rk); free(erk);
    rules_free(&rt);
    Py_XDECREF(devs);
    Py_XDECREF(wits);
    return PyBool_FromLong(ok);
fail:
    free(home); free(dmem); free(rk); free(erk);
    rules_free(&rt);
    Py_XDECREF(devs);
    Py_XDECREF(wits);
    return NULL;
}

/* time_order(devices, kinds, m, nc, needs, produces, dur_tab, job_dur, pairs, delays)
 *
 * The compiled form of pipeloom.sim.kernel._time_order_py (the specification): time a fixed per-device
 * order. It knows no dependency rule: needs[k*nc+c] = ((event, chunk offset, comm), ...) and
 * produces[k*nc+c] = (event, ...) are pipeloom.core.rules as tables (pipeloom.sim.kernel.Rules), k the index of
 * the job's kind in kinds. Durations per (kind, chunk) in dur_tab (4*nc floats) or per job in job_dur (lists
 * per device); pairs: None or {(d, i): (p1, p2, p3)} (an overlapped pair ends at start + p1 + p2 - p3);
 * delays: None or per-job idle before the job. Returns (start, end, total), or (None, "range", d, i),
 * or (None, "deadlock", [(d, i, missing event key), ...]) exactly as the Python loop does.
 * With summary (an optional 11th argument, true): (makespan, total) or None on any failure, and no
 * per-job lists or stuck list are built (the planners' re-timing of candidate orders).
 */
static int parse_job(PyObject *job, PyObject *const *kind4, long m, long nc, long *slot, long *mb) {
    if (!PyTuple_Check(job) || PyTuple_GET_SIZE(job) != 3) return -1;
    PyObject *k = PyTuple_GET_ITEM(job, 0);
    int ki = k == kind4[0] ? 0 : k == kind4[1] ? 1 : k == kind4[2] ? 2 : k == kind4[3] ? 3 : -1;
    PyObject *omb = PyTuple_GET_ITEM(job, 1), *oc = PyTuple_GET_ITEM(job, 2);
    if (ki < 0 || !PyLong_Check(omb) || !PyLong_Check(oc)) return -1;
    int of1 = 0, of2 = 0;
    long b = PyLong_AsLongAndOverflow(omb, &of1), c = PyLong_AsLongAndOverflow(oc, &of2);
    if (PyErr_Occurred()) PyErr_Clear();
    if (of1 || of2 || b < 0 || b >= m || c < 0 || c >= nc) return -1;
    *slot = ki * nc + c;
    *mb = b;
    return 0;
}

/* per-device sequences of floats -> one flat array aligned with the jobs (NULL + exception on error) */
static double *flat_doubles(PyObject *o, Py_ssize_t pp, const Py_ssize_t *off, const char *what) {
    PyObject *fast = PySequence_Fast(o, what);
    if (!fast) return NULL;
    double *out = NULL;
    if (PySequence_Fast_GET_SIZE(fast) != pp) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd device lists", what, pp);
        goto fail;
    }
    out = malloc((size_t)(off[pp] ? off[pp] : 1) * sizeof(double));
    if (!out) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t d = 0; d < pp; d++) {
        double *x = as_doubles(PySequence_Fast_GET_ITEM(fast, d), off[d + 1] - off[d], what);
        if (!x) goto fail;
        memcpy(out + off[d], x, (size_t)(off[d + 1] - off[d]) * sizeof(double));
        free(x);
    }
    Py_DECREF(fast);
    return out;
fail:
    free(out);
    Py_DECREF(fast);
    return NULL;
}

static PyObject *time_order(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *devices, *kinds, *o_needs, *o_prod, *o_dur, *o_jdur, *o_pairs, *o_delays;
    long m, nc;
    int summary = 0;
    if (!PyArg_ParseTuple(args, "OOllOOOOOO|p", &devices, &kinds, &m, &nc, &o_needs, &o_prod, &o_dur, &o_jdur,
                          &o_pairs, &o_delays, &summary))
        return NULL;
    if (!PyTuple_Check(kinds) || PyTuple_GET_SIZE(kinds) != 4 || m < 1 || nc < 1) {
        PyErr_SetString(PyExc_ValueError, "time_order: kinds must be a 4-tuple, m and nc >= 1");
        return NULL;
    }
    if ((o_dur == Py_None) == (o_jdur == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "time_order: give dur_tab or job_dur");
        return NULL;
    }
    PyObject *kind4[4];
    for (int k = 0; k < 4; k++) kind4[k] = PyTuple_GET_ITEM(kinds, k);
    const Py_ssize_t nslot = 4 * (Py_ssize_t)nc, mnc = (Py_ssize_t)m * nc;
    PyObject *result = NULL, *devs = NULL, **seqs = NULL;
    Py_ssize_t *off = NULL, *nstart = NULL, *pstart = NULL, *ptr = NULL;
    long *nev = NULL, *noff = NULL, *pev = NULL, *jslot = NULL, *jmb = NULL, *stack = NULL, *head = NULL,
         *nextw = NULL;
    double *ncm = NULL, *dur = NULL, *jdur = NULL, *delay = NULL, *done = NULL, *st = NULL, *en = NULL,
           *free_t = NULL, *p1 = NULL, *p2 = NULL, *p3 = NULL;
    unsigned char *ispair = NULL;
    Py_ssize_t pp = 0;

    devs = PySequence_Fast(devices, "devices");
    if (!devs) return NULL;
    pp = PySequence_Fast_GET_SIZE(devs);
    seqs = calloc((size_t)(pp ? pp : 1), sizeof(PyObject *));
    off = calloc((size_t)pp + 1, sizeof(Py_ssize_t));
    if (!seqs || !off) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t d = 0; d < pp; d++) {
        seqs[d] = PySequence_Fast(PySequence_Fast_GET_ITEM(devs, d), "device list");
        if (!seqs[d]) goto done;
        off[d + 1] = off[d] + PySequence_Fast_GET_SIZE(seqs[d]);
    }
    const Py_ssize_t total = off[pp];
    /* the rule tables, as CSR arrays */
    {
        RuleTab rt;
        if (rules_parse(o_needs, o_prod, nslot, &rt) < 0) goto done;
        nstart = rt.nstart, pstart = rt.pstart, nev = rt.nev, noff = rt.noff, ncm = rt.ncm, pev = rt.pev;
    }
    if (o_dur != Py_None && !(dur = as_doubles(o_dur, nslot, "dur_tab"))) goto done;
    if (o_jdur != Py_None && !(jdur = flat_doubles(o_jdur, pp, off, "job_durations"))) goto done;
    if (o_delays != Py_None && !(delay = flat_doubles(o_delays, pp, off, "delays"))) goto done;
    jslot = malloc((size_t)(total ? total : 1) * sizeof(long));
    jmb = malloc((size_t)(total ? total : 1) * sizeof(long));
    ispair = calloc((size_t)(total ? total : 1), 1);
    done = malloc((size_t)3 * mnc * sizeof(double));
    head = malloc((size_t)3 * mnc * sizeof(long));
    st = malloc((size_t)(total ? total : 1) * sizeof(double));
    en = malloc((size_t)(total ? total : 1) * sizeof(double));
    free_t = calloc((size_t)(pp ? pp : 1), sizeof(double));
    ptr = calloc((size_t)(pp ? pp : 1), sizeof(Py_ssize_t));
    stack = malloc((size_t)(pp ? pp : 1) * sizeof(long));
    nextw = malloc((size_t)(pp ? pp : 1) * sizeof(long));
    if (!jslot || !jmb || !ispair || !done || !head || !st || !en || !free_t || !ptr || !stack || !nextw) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t q = 0; q < 3 * mnc; q++) {
        done[q] = -1.0;
        head[q] = -1;
    }
    for (Py_ssize_t d = 0; d < pp; d++) {
        for (Py_ssize_t i = 0; i < off[d + 1] - off[d]; i++) {
            long sl, mb;
            if (parse_job(PySequence_Fast_GET_ITEM(seqs[d], i), kind4, m, nc, &sl, &mb) < 0) sl = -1, mb = 0;
            jslot[off[d] + i] = sl;
            jmb[off[d] + i] = mb;
            st[off[d] + i] = en[off[d] + i] = 0.0;
        }
    }
    if (o_pairs != Py_None) {
        if (!PyDict_Check(o_pairs)) {
            PyErr_SetString(PyExc_TypeError, "time_order: pairs must be a dict or None");
            goto done;
        }
        Py_ssize_t n_p = PyDict_Size(o_pairs);
        p1 = malloc((size_t)(n_p ? n_p : 1) * sizeof(double));
        p2 = malloc((size_t)(n_p ? n_p : 1) * sizeof(double));
        p3 = malloc((size_t)(n_p ? n_p : 1) * sizeof(double));
        if (!p1 || !p2 || !p3) {
            PyErr_NoMemory();
            goto done;
        }
        /* ispair[job] = 1 and, until the pair is timed, st[job] = its index into p1..p3 */
        Py_ssize_t pos = 0, k = 0;
        PyObject *key, *val;
        while (PyDict_Next(o_pairs, &pos, &key, &val)) {
            long d, i;
            if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2 || !PyTuple_Check(val) || PyTuple_GET_SIZE(val) != 3) {
                PyErr_SetString(PyExc_TypeError, "time_order: pairs maps (d, i) to (p1, p2, p3)");
                goto done;
            }
            d = PyLong_AsLong(PyTuple_GET_ITEM(key, 0));
            i = PyLong_AsLong(PyTuple_GET_ITEM(key, 1));
            if (PyErr_Occurred()) goto done;
            if (d < 0 || d >= pp || i < 0 || i + 1 >= off[d + 1] - off[d]) continue;
            p1[k] = PyFloat_AsDouble(PyTuple_GET_ITEM(val, 0));
            p2[k] = PyFloat_AsDouble(PyTuple_GET_ITEM(val, 1));
            p3[k] = PyFloat_AsDouble(PyTuple_GET_ITEM(val, 2));
            if (PyErr_Occurred()) goto done;
            ispair[off[d] + i] = 1;
            st[off[d] + i] = (double)k; /* the pair's index, until the job is timed */
            k++;
        }
    }

    Py_ssize_t sp = 0;
    for (Py_ssize_t d = pp - 1; d >= 0; d--) stack[sp++] = (long)d;
    while (sp) {
        long d = stack[--sp];
        Py_ssize_t i = ptr[d], n = off[d + 1] - off[d], o = off[d];
        double t_free = free_t[d];
        while (i < n) {
            /* ready() of the job at i (and of its partner when it starts an overlapped pair) */
            int np = ispair[o + i] ? 2 : 1;
            double r = 0.0;
            long wait = -1;
            for (int h = 0; h < np && wait < 0; h++) {
                long sl = jslot[o + i + h];
                if (sl < 0) {
                    if (summary) {
                        Py_INCREF(Py_None);
                        result = Py_None;
                    } else {
                        result = Py_BuildValue("(Osnn)", Py_None, "range", (Py_ssize_t)d, i + h);
                    }
                    goto done;
                }
                long c = sl % nc;
                Py_ssize_t base = (Py_ssize_t)jmb[o + i + h] * nc + c;
                double rh = 0.0;
                for (Py_ssize_t q = nstart[sl]; q < nstart[sl + 1]; q++) {
                    Py_ssize_t key = nev[q] * mnc + base + noff[q];
                    double e = done[key];
                    if (e < 0) {
                        wait = (long)key;
                        break;
                    }
                    e += ncm[q];
                    if (e > rh) rh = e;
                }
                if (h == 0)
                    r = rh;
                else if (rh > r)
                    r = rh;
            }
            if (wait >= 0) {
                nextw[d] = head[wait];
                head[wait] = d;
                break;
            }
            double s0 = t_free > r ? t_free : r;
            if (delay) s0 = s0 + delay[o + i];
            double t;
            if (np == 2) {
                Py_ssize_t k = (Py_ssize_t)st[o + i];
                t = s0 + p1[k] + p2[k] - p3[k];
                st[o + i] = st[o + i + 1] = s0;
                en[o + i] = en[o + i + 1] = t;
            } else {
                t = s0 + (jdur ? jdur[o + i] : dur[jslot[o + i]]);
                st[o + i] = s0;
                en[o + i] = t;
            }
            for (int h = 0; h < np; h++) {
                long sl = jslot[o + i + h];
                Py_ssize_t base = (Py_ssize_t)jmb[o + i + h] * nc + sl % nc;
                for (Py_ssize_t q = pstart[sl]; q < pstart[sl + 1]; q++) {
                    Py_ssize_t key = pev[q] * mnc + base;
                    done[key] = t;
                    for (long w = head[key]; w >= 0; w = nextw[w]) stack[sp++] = w;
                    head[key] = -1;
                }
            }
            i += np;
            t_free = t;
        }
        ptr[d] = i;
        free_t[d] = t_free;
    }
    if (summary) { /* the same makespan and sum of ends as the full result gives, and no lists */
        double mk = 0.0, tot = 0.0;
        for (Py_ssize_t d = 0; d < pp; d++) {
            Py_ssize_t n = off[d + 1] - off[d];
            if (ptr[d] < n) {
                Py_INCREF(Py_None);
                result = Py_None;
                goto done;
            }
            if (n && en[off[d] + n - 1] > mk) mk = en[off[d] + n - 1];
        }
        for (Py_ssize_t d = 0; d < pp; d++)
            for (Py_ssize_t i = off[d]; i < off[d + 1]; i++) tot += en[i];
        result = Py_BuildValue("(dd)", mk, tot);
        goto done;
    }
    {
        PyObject *stuck = PyList_New(0);
        if (!stuck) goto done;
        for (Py_ssize_t d = 0; d < pp; d++) {
            Py_ssize_t i = ptr[d];
            if (i >= off[d + 1] - off[d]) continue;
            long miss = -1;
            for (int h = 0; h < (ispair[off[d] + i] ? 2 : 1) && miss < 0; h++) {
                long sl = jslot[off[d] + i + h];
                Py_ssize_t base = (Py_ssize_t)jmb[off[d] + i + h] * nc + sl % nc;
                for (Py_ssize_t q = nstart[sl]; q < nstart[sl + 1]; q++) {
                    Py_ssize_t key = nev[q] * mnc + base + noff[q];
                    if (done[key] < 0) {
                        miss = (long)key;
                        break;
                    }
                }
            }
            PyObject *t = Py_BuildValue("(nnl)", d, i, miss);
            if (!t || PyList_Append(stuck, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(stuck);
                goto done;
            }
            Py_DECREF(t);
        }
        if (PyList_GET_SIZE(stuck)) {
            result = Py_BuildValue("(OsN)", Py_None, "deadlock", stuck);
            goto done;
        }
        Py_DECREF(stuck);
    }
    {
        PyObject *ls = PyList_New(pp), *le = PyList_New(pp);
        double tot = 0.0;
        if (!ls || !le) {
            Py_XDECREF(ls);
            Py_XDECREF(le);
            goto done;
        }
        for (Py_ssize_t d = 0; d < pp; d++) {
            Py_ssize_t n = off[d + 1] - off[d];
            PyObject *a = list_of_doubles(st + off[d], n), *b = list_of_doubles(en + off[d], n);
            if (!a || !b) {
                Py_XDECREF(a);
                Py_XDECREF(b);
                Py_DECREF(ls);
                Py_DECREF(le);
                goto done;
            }
            PyList_SET_ITEM(ls, d, a);
            PyList_SET_ITEM(le, d, b);
            for (Py_ssize_t i = 0; i < n; i++) tot += en[off[d] + i];
        }
        result = Py_BuildValue("(NNd)", ls, le, tot);
    }
done:
    if (seqs)
        for (Py_ssize_t d = 0; d < pp; d++) Py_XDECREF(seqs[d]);
    free(seqs); free(off); free(nstart); free(pstart); free(ptr); free(nev); free(noff); free(pev); free(jslot);
    free(jmb); free(stack); free(head); free(nextw); free(ncm); free(dur); free(jdur); free(delay); free(done);
    free(st); free(en); free(free_t); free(p1); free(p2); free(p3); free(ispair);
    Py_XDECREF(devs);
    return result;
}

/* ---------------------------------------------------------------- board_replay (for the differential test)
 * board_replay(m, pp, needs, produces, durations, dmem, dev, jobs) -> (starts, ends, peak) or None
 *   jobs: (device, slot, mb) in commit order; each is placed at its earliest start (board_ready, as
 *   Board.place) on a board with room for len(jobs) jobs per device. None when a job is placed before an
 *   input it needs (board_ready < 0). tests/sim/test_listsched.py holds this against Board and core.rules.
 */
static PyObject *board_replay(PyObject *self, PyObject *args) {
    (void)self;
    long m, pp;
    PyObject *o_needs, *o_prod, *o_dur, *o_dmem, *o_dev, *o_jobs;
    if (!PyArg_ParseTuple(args, "llOOOOOO", &m, &pp, &o_needs, &o_prod, &o_dur, &o_dmem, &o_dev, &o_jobs)) return NULL;
    Py_ssize_t nc = PyObject_Length(o_dev);
    if (nc < 1 || m < 1 || pp < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "board_replay: m, pp and chunks must be >= 1");
        return NULL;
    }
    PyObject *jobs = PySequence_Fast(o_jobs, "jobs");
    if (!jobs) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(jobs);
    Board b;
    PyObject *result = NULL;
    double *st = malloc((size_t)(n ? n : 1) * sizeof(double)), *en = malloc((size_t)(n ? n : 1) * sizeof(double));
    if (board_init(&b, pp, nc, m, n ? n : 1, o_needs, o_prod, o_dur, o_dmem, o_dev) < 0) goto done;
    if (!st || !en) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long d, slot, mb;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(jobs, i), "lll", &d, &slot, &mb)) goto done;
        if (d < 0 || d >= pp || slot < 0 || slot >= 4 * nc || mb < 0 || mb >= m) {
            PyErr_SetString(PyExc_ValueError, "board_replay: job out of range");
            goto done;
        }
        double r = board_ready(&b, slot, mb);
        if (r < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        double f = b.free_t[d];
        st[i] = f >= r ? f : r;
        en[i] = board_commit(&b, d, slot, mb, st[i]);
        if (PyErr_Occurred()) goto done;
    }
    result = Py_BuildValue("(NNN)", list_of_doubles(st, n), list_of_doubles(en, n), list_of_doubles(b.peak, pp));
done:
    board_free(&b);
    free(st);
    free(en);
    Py_DECREF(jobs);
    return result;
}

/* ---------------------------------------------------------------- lock-step pass
 * lockstep_pass(shape, needs, produces, durations, dmem, dev, a, approved, job_type, kinds)
 *   shape = (pp, m, limit, eps, fill_b, fill_f); needs/produces = pipeloom.sim.kernel.Rules tables;
 *   durations/dmem: per slot (pipeloom.sim.kernel.duration_table, pipeloom.sim.listsched.mem_table);
 *   dev, a: per chunk; approved: per device or None; kinds = pipeloom.sim.kernel.KINDS
 * -> None when the pass breaks a rule, else (seqs, bub).
 * A transcription of pipeloom.schedule.search.lockstep._one_pass_py (the specification) on the board:
 * the same decisions, the same float operations in the same order (tests/schedule/test_lockstep_c.py).
 */
typedef struct {
    Board b;
    long pp, m, nc, sF, sB, sW;
    double limit, eps, max_appr;
    long *cnt4, *slot_of, *pend_mb, *pend_c, *ph, *pt;
    double *bub, *appr;
} LS;

static double ls_allowed(const LS *s, long d) {
    double mb = s->bub[0];
    for (long j = 1; j < s->pp; j++)
        if (s->bub[j] > mb) mb = s->bub[j];
    double x = s->max_appr - s->appr[d];
    return x > mb ? x : mb;
}

/* 0 placed; 1 the pass breaks (no exception); -1 error (exception set) */
static int ls_put(LS *s, long d, int slot) {
    long mb = s->cnt4[d * 4 + slot];
    if (mb >= s->m) return 1;
    long js = s->slot_of[d * 4 + slot];
    double r = board_ready(&s->b, js, mb);
    if (r < 0) return 1;
    double cur = s->b.free_t[d];
    double st = cur >= r ? cur : r;
    if (s->cnt4[d * 4] > 0) s->bub[d] += st - cur;
    if (slot < 2 && !(s->b.mem[d] + s->b.dmem[js] <= s->limit)) return 1;
    if (board_commit(&s->b, d, js, mb, st) < 0 && PyErr_Occurred()) return -1;
    if (slot >= 2) {
        Py_ssize_t q = (Py_ssize_t)d * 2 * s->m + s->pt[d];
        s->pend_mb[q] = mb;
        s->pend_c[q] = js - s->sB;
        s->pt[d] += 1;
    }
    s->cnt4[d * 4 + slot] = mb + 1;
    return 0;
}

static int ls_put_w(LS *s, long d) {
    if (s->ph[d] >= s->pt[d]) return 1;
    Py_ssize_t q = (Py_ssize_t)d * 2 * s->m + s->ph[d];
    s->ph[d] += 1;
    if (board_commit(&s->b, d, s->sW + s->pend_c[q], s->pend_mb[q], s->b.free_t[d]) < 0 && PyErr_Occurred())
        return -1;
    return 0;
}

static int ls_fill(LS *s, long d, int slot, int extra) {
    long mb = s->cnt4[d * 4 + slot];
    if (mb >= s->m) return 1;
    double arr;
    if (!board_arrival(&s->b, s->slot_of[d * 4 + slot], mb, &arr)) return 0;
    int rc;
    while (s->ph[d] < s->pt[d] &&
           arr >= s->b.free_t[d] + s->b.dur[s->sW + s->pend_c[(Py_ssize_t)d * 2 * s->m + s->ph[d]]] - s->eps)
        if ((rc = ls_put_w(s, d))) return rc;
    if (extra && s->ph[d] < s->pt[d] && arr - s->b.free_t[d] > ls_allowed(s, d) - s->bub[d] + s->eps)
        if ((rc = ls_put_w(s, d))) return rc;
    return 0;
}

static int ls_run(LS *s, int fill_b, int fill_f, long *firsts, long *seconds) {
    const long pp = s->pp, m = s->m, nc = s->nc;
    const double *dur = s->b.dur;
    long *cnt = s->cnt4;
    int rc;
#define LS_TRY(x) do { if ((rc = (x))) return rc; } while (0)
    /* ---- warm-up, part 1 */
    for (long d = 0; d < pp; d++) LS_TRY(ls_put(s, d, 0));
    for (long d = pp - 1; d >= 0; d--) {
        if (d < pp - 1) {
            double due = board_ready(&s->b, s->slot_of[d * 4 + 1], 0);
            double head = s->b.dmem[s->sF + d] * (double)(2 + 2 * d); /* a(lo[d]) = the memory F allocates */
            while (s->b.mem[d] + head <= s->limit && s->b.free_t[d] + dur[s->sF + d] <= due + s->eps && cnt[d * 4] < m)
                for (long j = 0; j <= d; j++) LS_TRY(ls_put(s, j, 0));
        }
        LS_TRY(ls_put(s, d, 1));
    }
    /* ---- warm-up, part 2 */
    int it = 0;
    for (long d = 1; d < pp; d++) {
        int idle = 0;
        while (cnt[d * 4] + cnt[d * 4 + 1] < cnt[(d - 1) * 4] + cnt[(d - 1) * 4 + 1] ||
               (cnt[d * 4 + 1] <= cnt[(d - 1) * 4 + 1] && cnt[(d - 1) * 4 + 1] < m)) {
            int placed = 0;
            for (long j = pp - 1; j >= d; j--) {
                if (cnt[j * 4 + it] < m) {
                    LS_TRY(ls_put(s, j, it));
                    placed = 1;
                }
            }
            it = 1 - it;
            idle = placed ? 0 : idle + 1;
            if (idle >= 2) return 1;
        }
    }
    /* ---- steady state */
    for (long round = 0; round < 2 * m; round++) {
        long nf = 0, ns = 0;
        for (long d = 0; d < pp; d++) {
            if (cnt[d * 4 + 3] >= cnt[d * 4 + 2])
                seconds[ns++] = d;
            else if (d == pp - 1 || cnt[d * 4 + 2] >= m || board_event(&s->b, 1, cnt[d * 4 + 3], d + 1) >= 0)
                firsts[nf++] = d;
            else
                seconds[ns++] = d;
        }
        for (long i = nf - 1; i >= 0; i--) {
            long d = firsts[i];
            if (cnt[d * 4 + 3] >= m) continue;
            LS_TRY(ls_fill(s, d, 3, 1));
            LS_TRY(ls_put(s, d, 3));
        }
        for (long i = 0; i < ns; i++) {
            long d = seconds[i];
            if (cnt[d * 4 + 2] >= m) continue;
            LS_TRY(ls_fill(s, d, 2, fill_b));
            LS_TRY(ls_put(s, d, 2));
        }
        for (long d = 0; d < pp; d++) {
            if (cnt[d * 4 + 1] >= m) continue;
            int slot = -1;
            if (cnt[d * 4 + 1] >= cnt[d * 4])
                slot = 0;
            else if (d == pp - 1 || board_event(&s->b, 0, cnt[d * 4 + 1], nc - 2 - d) >= 0)
                slot = 1;
            else if (cnt[d * 4] < m && (d == 0 || board_event(&s->b, 0, cnt[d * 4], d - 1) >= 0))
                slot = 0;
            if (slot < 0) continue;
            long js = s->slot_of[d * 4 + slot];
            while (!(s->b.mem[d] + s->b.dmem[js] <= s->limit)) LS_TRY(ls_put_w(s, d));
            LS_TRY(ls_fill(s, d, slot, fill_f));
            LS_TRY(ls_put(s, d, slot));
        }
    }
    for (long d = 0; d < pp; d++)
        while (s->ph[d] < s->pt[d]) LS_TRY(ls_put_w(s, d));
    for (long d = 0; d < pp; d++)
        for (int k = 0; k < 4; k++)
            if (cnt[d * 4 + k] != m) return 1;
#undef LS_TRY
    return 0;
}

static PyObject *lockstep_pass(PyObject *self, PyObject *args) {
    (void)self;
    int pp, m, fill_b, fill_f;
    double limit, eps;
    PyObject *o_needs, *o_prod, *o_dur, *o_dmem, *o_dev, *o_a, *o_appr, *job_type, *kinds;
    if (!PyArg_ParseTuple(args, "(iiddpp)OOOOOOOOO", &pp, &m, &limit, &eps, &fill_b, &fill_f, &o_needs, &o_prod,
                          &o_dur, &o_dmem, &o_dev, &o_a, &o_appr, &job_type, &kinds))
        return NULL;
    if (check_job_args(job_type, kinds, 4, "lockstep_pass") < 0) return NULL;
    if (pp < 1 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "lockstep_pass: pp and m must be >= 1");
        return NULL;
    }
    LS s;
    memset(&s, 0, sizeof(s));
    PyObject *result = NULL;
    long *firsts = NULL, *seconds = NULL;
    const long nc = 2L * pp;
    s.pp = pp, s.m = m, s.nc = nc, s.limit = limit, s.eps = eps;
    s.sF = 0, s.sB = nc, s.sW = 2 * nc; /* slots: kind index (F 0, B 1, W 2) * nc + chunk */
    if (board_init(&s.b, pp, nc, m, 6L * m, o_needs, o_prod, o_dur, o_dmem, o_dev) < 0) goto done;
    (void)o_a;
    s.cnt4 = calloc((size_t)pp * 4, sizeof(long));
    s.slot_of = malloc((size_t)pp * 4 * sizeof(long));
    s.pend_mb = malloc((size_t)pp * 2 * m * sizeof(long));
    s.pend_c = malloc((size_t)pp * 2 * m * sizeof(long));
    s.ph = calloc((size_t)pp, sizeof(long));
    s.pt = calloc((size_t)pp, sizeof(long));
    s.bub = calloc((size_t)pp, sizeof(double));
    firsts = malloc((size_t)pp * sizeof(long));
    seconds = malloc((size_t)pp * sizeof(long));
    if (o_appr == Py_None) {
        s.appr = malloc((size_t)pp * sizeof(double));
        if (s.appr)
            for (long d = 0; d < pp; d++) s.appr[d] = -1.0;
    } else if (!(s.appr = as_doubles(o_appr, pp, "approved"))) {
        goto done;
    }
    if (!s.cnt4 || !s.slot_of || !s.pend_mb || !s.pend_c || !s.ph || !s.pt || !s.bub || !s.appr || !firsts ||
        !seconds) {
        PyErr_NoMemory();
        goto done;
    }
    s.max_appr = s.appr[0];
    for (long d = 1; d < pp; d++)
        if (s.appr[d] > s.max_appr) s.max_appr = s.appr[d];
    for (long d = 0; d < pp; d++) { /* 0 = F(lo), 1 = F(hi), 2 = B(hi), 3 = B(lo); lo = d, hi = nc-1-d */
        s.slot_of[d * 4 + 0] = s.sF + d;
        s.slot_of[d * 4 + 1] = s.sF + nc - 1 - d;
        s.slot_of[d * 4 + 2] = s.sB + nc - 1 - d;
        s.slot_of[d * 4 + 3] = s.sB + d;
    }
    int rc = ls_run(&s, fill_b, fill_f, firsts, seconds);
    if (rc < 0) goto done;
    if (rc > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *seqs = board_seqs(&s.b, job_type, kinds);
    if (!seqs) goto done;
    PyObject *lb = list_of_doubles(s.bub, pp);
    if (!lb) {
        Py_DECREF(seqs);
        goto done;
    }
    result = Py_BuildValue("(NN)", seqs, lb);
done:
    board_free(&s.b);
    free(s.cnt4); free(s.slot_of); free(s.pend_mb); free(s.pend_c); free(s.ph); free(s.pt); free(s.bub); free(s.appr);
    free(firsts); free(seconds);
    return result;
}

/* ---------------------------------------------------------------- the list-scheduling loop
 * pipeloom.sim.listsched.run on the C board, for the passes that are policies of it (paced, template): each
 * device's first decision point from first(); at a point, step() gives the job to run from T (1 and *slot,
 * *mb) or the next point to ask (0 and *next; INFINITY: asleep until fed); after a commit, fed() gives the
 * receiving device's new point when the job's handoff reaches another device, and after() the committing
 * device's. The same event order as the Python loop (a min-heap of (time, device), stale entries skipped).
 * start0/ord (may be NULL): each device's first start and each job's commit rank, per_dev apart.
 */
typedef struct {
    double (*first)(void *p, long d);
    int (*step)(void *p, long d, double T, long *slot, long *mb, double *next);
    double (*fed)(void *p, long d2, double arrival, double key);
    double (*after)(void *p, long d, double end);
} LSPolicy;

/* always inlined: each pass gets its own copy with direct calls to its policy (0, or -1 + exception) */
static inline __attribute__((always_inline)) int ls_loop(Board *b, const long *hoff, const double *hcm, void *p,
                                                         const LSPolicy *pol, double *key, Heap *h, double *start0,
                                                         int64_t *ord, Py_ssize_t per_dev) {
    const long pp = (long)b->pp;
    int64_t ncommit = 0;
    for (long d = 0; d < pp; d++) {
        key[d] = pol->first(p, d);
        if (key[d] < INFINITY && heap_push(h, (HItem){key[d], (int)d}) < 0) goto nomem;
    }
    if (!h->n) return 0;
    HItem item = heap_pop(h);
    for (;;) {
        const double T = item.t;
        const long d = item.d;
        if (T != key[d]) { /* stale */
            if (!h->n) break;
            item = heap_pop(h);
            continue;
        }
        long slot, mb;
        double next;
        if (!pol->step(p, d, T, &slot, &mb, &next)) {
            key[d] = next;
            if (next < INFINITY) {
                item = heap_pushpop(h, (HItem){next, (int)d});
                continue;
            }
            if (!h->n) break;
            item = heap_pop(h);
            continue;
        }
        double e = board_commit(b, d, slot, mb, T);
        if (e < 0 && PyErr_Occurred()) return -1;
        if (ord) {
            if (b->cnt[d] == 1) start0[d] = T;
            ord[(Py_ssize_t)d * per_dev + b->cnt[d] - 1] = ncommit++;
        }
        if (hoff[slot]) {
            long d2 = b->dev[b->schunk[slot] + hoff[slot]];
            if (d2 != d) {
                double k = pol->fed(p, d2, e + hcm[slot], key[d2]);
                if (k != key[d2]) {
                    key[d2] = k;
                    if (k < INFINITY && heap_push(h, (HItem){k, (int)d2}) < 0) goto nomem;
                }
            }
        }
        double k = pol->after(p, d, e);
        key[d] = k;
        if (k < INFINITY)
            item = heap_pushpop(h, (HItem){k, (int)d});
        else if (h->n)
            item = heap_pop(h);
        else
            break;
    }
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* ---------------------------------------------------------------- paced pass
 * paced_pass(shape, needs, produces, durations, dmem, dev, handoff, rows, job_type, kinds)
 *   shape = (pp, m, limit, eps, period, slack); limit with eps added, slack = inf for none;
 *   needs/produces = pipeloom.sim.kernel.Rules tables; durations/dmem: per slot; dev: per chunk;
 *   handoff: per slot None or (chunk offset, comm) (pipeloom.sim.listsched.handoff_table);
 *   rows: per device, per local chunk (chunk, B's base target, F's base target, memory an F must find free)
 *   (pipeloom.schedule.search.paced.chunk_rows); kinds = pipeloom.sim.kernel.KINDS
 * -> None when the pass deadlocks, else the per-device job lists.
 * The compiled form of pipeloom.schedule.search.paced.PacedPolicy on the event-driven loop of
 * pipeloom.sim.listsched.run (both the specification): readiness from board_ready, memory from the board's
 * dmem, every job placed by board_commit; the same decisions, the same float operations in the same order, the
 * same event order (tests/schedule/test_paced_c.py).
 */
typedef struct {
    long c;
    double tb0, tf0, need;
} PRow;

typedef struct {
    Board b;
    long pp, m, nc;
    double limit, eps, P, slack;
    PRow *rows;
    Py_ssize_t *rbeg;            /* device d's rows: rows[rbeg[d] .. rbeg[d+1]-1] */
    long *nf, *nb;               /* per chunk: the next forward / backward microbatch */
    long *pmb, *pc;              /* per device a queue of pending W (mb, chunk): pbeg[d] + ph[d] .. pt[d]-1 */
    Py_ssize_t *pbeg, *ph, *pt;
    long *hoff;                  /* per slot: the handoff's chunk offset, 0 for none (parse_handoff) */
    double *hcm;                 /* ... its comm */
} PC;

/* PacedPolicy.step: 1 and (*slot, *mb) = the job to run from T; 0 and *next = the next time to ask */
static int pc_step(PC *s, long d, double T, long *slot, long *mb_out, double *next) {
    const double now = T + s->eps, P = s->P, slack = s->slack, limit = s->limit;
    const long nc = s->nc, m = s->m;
    double bt = INFINITY, due = INFINITY;
    int kind = -1, blocked = 0;
    long c = -1;
    const double md = s->b.mem[d];
    for (Py_ssize_t i = s->rbeg[d]; i < s->rbeg[d + 1]; i++) {
        const PRow *row = &s->rows[i];
        const long ch = row->c;
        long mb = s->nb[ch];
        if (mb < s->nf[ch]) { /* backward */
            double r = board_ready(&s->b, nc + ch, mb);
            if (r >= 0) {
                double tg = row->tb0 + (double)mb * P;
                double st = tg - slack;
                if (r > st) st = r;
                if (st <= now) {
                    if (tg < bt) bt = tg, kind = 1, c = ch;
                } else if (st < due) {
                    due = st;
                }
            }
        }
        mb = s->nf[ch];
        if (mb < m) { /* forward */
            double r = board_ready(&s->b, ch, mb);
            if (r >= 0) {
                double tg = row->tf0 + (double)mb * P;
                double st = tg - slack;
                if (r > st) st = r;
                if (md + row->need > limit) {
                    if (st <= now) blocked = 1;
                } else if (st <= now) {
                    if (tg < bt) bt = tg, kind = 0, c = ch;
                } else if (st < due) {
                    due = st;
                }
            }
        }
    }
    if (kind == 0) {
        *slot = c, *mb_out = s->nf[c]++;
        return 1;
    }
    if (kind == 1) {
        long mb = s->nb[c]++;
        Py_ssize_t q = s->pbeg[d] + s->pt[d]++;
        s->pmb[q] = mb, s->pc[q] = c;
        *slot = nc + c, *mb_out = mb;
        return 1;
    }
    const int pw = s->ph[d] < s->pt[d];
    const Py_ssize_t q = s->pbeg[d] + s->ph[d];
    if (pw && (blocked || due == INFINITY || due - T >= s->b.dur[2 * nc + s->pc[q]] - s->eps)) {
        s->ph[d]++;
        *slot = 2 * nc + s->pc[q], *mb_out = s->pmb[q];
        return 1;
    }
    if (due < INFINITY) {
        *next = due;
        return 0;
    }
    if (pw) {
        s->ph[d]++;
        *slot = 2 * nc + s->pc[q], *mb_out = s->pmb[q];
        return 1;
    }
    *next = INFINITY; /* asleep until a dependency is scheduled */
    return 0;
}

/* the paced policy's hooks of ls_loop: every device asks at 0; after: the job's end; fed: the later of the
   device's clock and the arrival, if earlier than its point */
static double pc_first(void *p, long d) { (void)p, (void)d; return 0.0; }
static int pc_step_p(void *p, long d, double T, long *slot, long *mb, double *next) {
    return pc_step((PC *)p, d, T, slot, mb, next);
}
static double pc_fed(void *p, long d2, double arrival, double key) {
    double f = ((PC *)p)->b.free_t[d2];
    double k = f > arrival ? f : arrival;
    return k < key ? k : key;
}
static double pc_after(void *p, long d, double end) { (void)p, (void)d; return end; }
static const LSPolicy PACED = {pc_first, pc_step_p, pc_fed, pc_after};

static PyObject *paced_pass(PyObject *self, PyObject *args) {
    (void)self;
    int pp, m;
    double limit, eps, period, slack;
    PyObject *o_needs, *o_prod, *o_dur, *o_dmem, *o_dev, *o_hand, *o_rows, *job_type, *kinds;
    if (!PyArg_ParseTuple(args, "(iidddd)OOOOOOOOO", &pp, &m, &limit, &eps, &period, &slack, &o_needs, &o_prod,
                          &o_dur, &o_dmem, &o_dev, &o_hand, &o_rows, &job_type, &kinds))
        return NULL;
    if (check_job_args(job_type, kinds, 4, "paced_pass") < 0) return NULL;
    Py_ssize_t nc = PyObject_Length(o_dev);
    if (nc < 1 || pp < 1 || m < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "paced_pass: pp, m and chunks must be >= 1");
        return NULL;
    }
    PC s;
    memset(&s, 0, sizeof(s));
    Heap h = {NULL, 0, 0};
    double *key = NULL;
    PyObject *result = NULL, *frows = NULL;
    s.pp = pp, s.m = m, s.nc = (long)nc, s.limit = limit, s.eps = eps, s.P = period, s.slack = slack;
    /* the rows first: they give each device's chunks, hence its jobs */
    if (!(frows = PySequence_Fast(o_rows, "rows"))) goto done;
    if (PySequence_Fast_GET_SIZE(frows) != pp) {
        PyErr_SetString(PyExc_ValueError, "paced_pass: rows must have one entry per device");
        goto done;
    }
    s.rbeg = calloc((size_t)pp + 1, sizeof(Py_ssize_t));
    s.rows = malloc((size_t)nc * sizeof(PRow));
    if (!s.rbeg || !s.rows) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nrow = 0, maxloc = 1;
    for (long d = 0; d < pp; d++) {
        PyObject *dr = PySequence_Fast(PySequence_Fast_GET_ITEM(frows, d), "device rows");
        if (!dr) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(dr);
        if (n > maxloc) maxloc = n;
        for (Py_ssize_t i = 0; i < n; i++) {
            PRow r;
            if (nrow >= nc || !PyArg_ParseTuple(PySequence_Fast_GET_ITEM(dr, i), "lddd", &r.c, &r.tb0, &r.tf0, &r.need) ||
                r.c < 0 || r.c >= nc) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "paced_pass: a row names a chunk out of range");
                Py_DECREF(dr);
                goto done;
            }
            for (Py_ssize_t j = 0; j < nrow; j++)
                if (s.rows[j].c == r.c) {
                    PyErr_SetString(PyExc_ValueError, "paced_pass: a chunk is in two rows");
                    Py_DECREF(dr);
                    goto done;
                }
            s.rows[nrow++] = r;
        }
        Py_DECREF(dr);
        s.rbeg[d + 1] = nrow;
    }
    if (board_init(&s.b, pp, nc, m, 3 * (Py_ssize_t)m * maxloc, o_needs, o_prod, o_dur, o_dmem, o_dev) < 0) goto done;
    if (parse_handoff(o_hand, nc, &s.hoff, &s.hcm) < 0) goto done;
    s.nf = calloc((size_t)nc, sizeof(long));
    s.nb = calloc((size_t)nc, sizeof(long));
    s.pmb = malloc((size_t)(nc * m) * sizeof(long));
    s.pc = malloc((size_t)(nc * m) * sizeof(long));
    s.pbeg = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.ph = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.pt = calloc((size_t)pp, sizeof(Py_ssize_t));
    key = malloc((size_t)pp * sizeof(double));
    if (!s.nf || !s.nb || !s.pmb || !s.pc || !s.pbeg || !s.ph || !s.pt || !key) {
        PyErr_NoMemory();
        goto done;
    }
    for (long d = 1; d < pp; d++) /* device d's pending W: at most m per local chunk */
        s.pbeg[d] = s.pbeg[d - 1] + (s.rbeg[d] - s.rbeg[d - 1]) * m;
    if (ls_loop(&s.b, s.hoff, s.hcm, &s, &PACED, key, &h, NULL, NULL, 0) < 0) goto done;
    Py_ssize_t placed = 0;
    for (long d = 0; d < pp; d++) placed += s.b.cnt[d];
    if (placed != 3 * (Py_ssize_t)m * nc)
        result = Py_NewRef(Py_None);
    else
        result = board_seqs(&s.b, job_type, kinds);
done:
    board_free(&s.b);
    free(s.rows); free(s.rbeg); free(s.nf); free(s.nb); free(s.pmb); free(s.pc); free(s.pbeg); free(s.ph); free(s.pt);
    free(s.hoff); free(s.hcm); free(key); free(h.v);
    Py_XDECREF(frows);
    return result;
}

/* ---------------------------------------------------------------- template pass
 * template_pass(shape, needs, produces, durations, dmem, dev, handoff, orders, lags, job_type, kinds)
 *   shape = (pp, m, limit, eps, always); limit with eps added, always = the 'always' W fill (else 'fit');
 *   needs/produces/durations/dmem/dev/handoff as for paced_pass; orders: per device its fixed F/B order as
 *   flat ints (slot, mb, slot, mb, ...); lags: per device the pending W allowed before one is forced (inf: none)
 * -> None when the pass deadlocks, else (seqs, order_bytes, t, peak, start0) as run_pass.
 * The compiled form of pipeloom.schedule.zb_looped.TemplatePolicy on the event-driven loop of
 * pipeloom.sim.listsched.run (both the specification): readiness from board_ready, memory from the board's
 * dmem, every job placed by board_commit; the same decisions (a device's next step is decided when its own job
 * ends or an input reaches it, and kept until the loop reaches its time), the same float operations in the
 * same order, the same event order (tests/schedule/test_template_c.py).
 */
enum { TP_NONE = 0, TP_W = 1, TP_J = 2 };

typedef struct {
    Board b;
    long pp, nc;
    double limit, eps;
    int always;
    long *oslot, *omb;           /* device d's order: oslot/omb[obeg[d] .. obeg[d+1]-1] */
    Py_ssize_t *obeg, *ptr;      /* ptr[d]: the next job of d's order (an offset from obeg[d]) */
    long *pmb, *pc;              /* per device a queue of pending W (mb, chunk): pbeg[d] + ph[d] .. pt[d]-1 */
    Py_ssize_t *pbeg, *ph, *pt;
    double *lag;
    unsigned char *act;          /* per device its decided step: TP_NONE, TP_W or TP_J */
    long *hoff;                  /* per slot: the handoff's chunk offset, 0 for none (parse_handoff) */
    double *hcm;
} TP;

/* TemplatePolicy.decide: device d's next step into s->act[d]; its time (INFINITY: none) */
static double tp_decide(TP *s, long d) {
    const Board *b = &s->b;
    const long nc = s->nc;
    const Py_ssize_t npend = s->pt[d] - s->ph[d], o0 = s->obeg[d], n = s->obeg[d + 1] - o0, ptr = s->ptr[d];
    const double T = b->free_t[d];
    if (ptr >= n) {
        if (npend) {
            s->act[d] = TP_W;
            return T;
        }
        s->act[d] = TP_NONE;
        return INFINITY;
    }
    long slot = s->oslot[o0 + ptr], mb = s->omb[o0 + ptr];
    if (b->skind[slot] == 0 && !(b->mem[d] + b->dmem[slot] <= s->limit)) {
        if (npend) {
            s->act[d] = TP_W;
            return T;
        }
        /* nothing to free memory with: bring the next B whose F has run forward, else the device is stuck */
        Py_ssize_t j = -1;
        for (Py_ssize_t i = ptr; i < n; i++) {
            long sl = s->oslot[o0 + i];
            if (b->skind[sl] == 1) {
                if (board_event(b, 0, s->omb[o0 + i], b->schunk[sl]) >= 0) j = i;
                break;
            }
        }
        if (j < 0) {
            s->act[d] = TP_NONE;
            return INFINITY;
        }
        long js = s->oslot[o0 + j], jm = s->omb[o0 + j];
        memmove(&s->oslot[o0 + ptr + 1], &s->oslot[o0 + ptr], (size_t)(j - ptr) * sizeof(long));
        memmove(&s->omb[o0 + ptr + 1], &s->omb[o0 + ptr], (size_t)(j - ptr) * sizeof(long));
        s->oslot[o0 + ptr] = js, s->omb[o0 + ptr] = jm;
        slot = js, mb = jm;
    }
    double r = board_ready(b, slot, mb);
    if (r < 0) r = INFINITY;
    if (npend && ((double)npend > s->lag[d] ||
                  (r > T && (s->always || r == INFINITY ||
                             r - T >= b->dur[2 * nc + s->pc[s->pbeg[d] + s->ph[d]]] - s->eps)))) {
        s->act[d] = TP_W;
        return T;
    }
    if (r <= T) {
        s->act[d] = TP_J;
        return T;
    }
    if (r < INFINITY) {
        s->act[d] = TP_J;
        return r;
    }
    s->act[d] = TP_NONE;
    return INFINITY;
}

/* the template policy's hooks of ls_loop: a device decides its next step at the start, when its own job ends
   and when an input reaches it (after and fed: decide again); at its point it runs what it decided (a finite
   point always comes with a step): a pending W, or the next job of its order (a B queues its W) */
static double tp_first(void *p, long d) { return tp_decide((TP *)p, d); }
static int tp_step(void *p, long d, double T, long *slot, long *mb, double *next) {
    TP *s = p;
    (void)T, (void)next;
    if (s->act[d] == TP_W) {
        Py_ssize_t q = s->pbeg[d] + s->ph[d]++;
        *slot = 2 * s->nc + s->pc[q], *mb = s->pmb[q];
    } else {
        Py_ssize_t q = s->obeg[d] + s->ptr[d]++;
        *slot = s->oslot[q], *mb = s->omb[q];
        if (s->b.skind[*slot] == 1) {
            Py_ssize_t w = s->pbeg[d] + s->pt[d]++;
            s->pmb[w] = *mb, s->pc[w] = s->b.schunk[*slot];
        }
    }
    return 1;
}
static double tp_fed(void *p, long d2, double arrival, double key) {
    (void)arrival, (void)key;
    return tp_decide((TP *)p, d2);
}
static double tp_after(void *p, long d, double end) { (void)end; return tp_decide((TP *)p, d); }
static const LSPolicy TEMPLATE = {tp_first, tp_step, tp_fed, tp_after};

static PyObject *template_pass(PyObject *self, PyObject *args) {
    (void)self;
    int pp, m, always;
    double limit, eps;
    PyObject *o_needs, *o_prod, *o_dur, *o_dmem, *o_dev, *o_hand, *o_orders, *o_lags, *job_type, *kinds;
    if (!PyArg_ParseTuple(args, "(iiddp)OOOOOOOOOO", &pp, &m, &limit, &eps, &always, &o_needs, &o_prod, &o_dur,
                          &o_dmem, &o_dev, &o_hand, &o_orders, &o_lags, &job_type, &kinds))
        return NULL;
    if (check_job_args(job_type, kinds, 4, "template_pass") < 0) return NULL;
    Py_ssize_t nc = PyObject_Length(o_dev);
    if (nc < 1 || pp < 1 || m < 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "template_pass: pp, m and chunks must be >= 1");
        return NULL;
    }
    TP s;
    memset(&s, 0, sizeof(s));
    Heap h = {NULL, 0, 0};
    double *key = NULL, *start0 = NULL;
    int64_t *ord = NULL;
    PyObject *result = NULL, *forders = NULL;
    s.pp = pp, s.nc = (long)nc, s.limit = limit, s.eps = eps, s.always = always;
    if (!(forders = PySequence_Fast(o_orders, "orders"))) goto done;
    if (PySequence_Fast_GET_SIZE(forders) != pp) {
        PyErr_SetString(PyExc_ValueError, "template_pass: orders must have one entry per device");
        goto done;
    }
    s.obeg = calloc((size_t)pp + 1, sizeof(Py_ssize_t));
    if (!s.obeg) {
        PyErr_NoMemory();
        goto done;
    }
    for (long d = 0; d < pp; d++) {
        Py_ssize_t n = PyObject_Length(PySequence_Fast_GET_ITEM(forders, d));
        if (n < 0) goto done;
        if (n % 2) {
            PyErr_SetString(PyExc_ValueError, "template_pass: an order must be (slot, mb) pairs");
            goto done;
        }
        s.obeg[d + 1] = s.obeg[d] + n / 2;
    }
    const Py_ssize_t njob = s.obeg[pp];
    s.oslot = malloc((size_t)(njob ? njob : 1) * sizeof(long));
    s.omb = malloc((size_t)(njob ? njob : 1) * sizeof(long));
    s.pbeg = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.ptr = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.ph = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.pt = calloc((size_t)pp, sizeof(Py_ssize_t));
    s.act = calloc((size_t)pp, 1);
    key = malloc((size_t)pp * sizeof(double));
    start0 = calloc((size_t)pp, sizeof(double));
    if (!s.oslot || !s.omb || !s.pbeg || !s.ptr || !s.ph || !s.pt || !s.act || !key || !start0) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t per_dev = 1, npend_all = 0;
    for (long d = 0; d < pp; d++) {
        Py_ssize_t o0 = s.obeg[d], n = s.obeg[d + 1] - o0, nb = 0;
        long *flat = as_longs(PySequence_Fast_GET_ITEM(forders, d), 2 * n, "order");
        if (!flat) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            long sl = flat[2 * i], mb = flat[2 * i + 1];
            if (sl < 0 || sl >= 4 * nc || mb < 0 || mb >= m) {
                free(flat);
                PyErr_SetString(PyExc_ValueError, "template_pass: an order names a job out of range");
                goto done;
            }
            s.oslot[o0 + i] = sl, s.omb[o0 + i] = mb;
            if (sl / nc == 1) nb++;
        }
        free(flat);
        s.pbeg[d] = npend_all; /* device d's pending W: at most one per B of its order */
        npend_all += nb;
        if (n + nb > per_dev) per_dev = n + nb;
    }
    s.pmb = malloc((size_t)(npend_all ? npend_all : 1) * sizeof(long));
    s.pc = malloc((size_t)(npend_all ? npend_all : 1) * sizeof(long));
    ord = malloc((size_t)(pp * per_dev) * sizeof(int64_t));
    if (!s.pmb || !s.pc || !ord) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(s.lag = as_doubles(o_lags, pp, "lags"))) goto done;
    if (board_init(&s.b, pp, nc, m, per_dev, o_needs, o_prod, o_dur, o_dmem, o_dev) < 0) goto done;
    if (parse_handoff(o_hand, nc, &s.hoff, &s.hcm) < 0) goto done;
    if (ls_loop(&s.b, s.hoff, s.hcm, &s, &TEMPLATE, key, &h, start0, ord, per_dev) < 0) goto done;
    Py_ssize_t placed = 0;
    for (long d = 0; d < pp; d++) placed += s.b.cnt[d];
    if (placed != 3 * (Py_ssize_t)m * nc) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* ---- (seqs, order_bytes, t, peak, start0): the order ranks per device, per_dev apart */
    PyObject *seqs = board_seqs(&s.b, job_type, kinds);
    if (!seqs) goto done;
    PyObject *ob = PyBytes_FromStringAndSize((const char *)ord, (Py_ssize_t)(pp * per_dev * sizeof(int64_t)));
    PyObject *lt = list_of_doubles(s.b.free_t, pp), *lp = list_of_doubles(s.b.peak, pp), *ls = list_of_doubles(start0, pp);
    PyObject *lc = PyLong_FromSsize_t(per_dev);
    if (!ob || !lt || !lp || !ls || !lc) {
        Py_XDECREF(ob); Py_XDECREF(lt); Py_XDECREF(lp); Py_XDECREF(ls); Py_XDECREF(lc);
        Py_DECREF(seqs);
        goto done;
    }
    result = Py_BuildValue("(NNNNNN)", seqs, ob, lt, lp, ls, lc);
done:
    board_free(&s.b);
    free(s.oslot); free(s.omb); free(s.obeg); free(s.ptr); free(s.pmb); free(s.pc); free(s.pbeg); free(s.ph);
    free(s.pt); free(s.lag); free(s.act); free(s.hoff); free(s.hcm); free(key); free(start0); free(ord); free(h.v);
    Py_XDECREF(forders);
    return result;
}

/* ---------------------------------------------------------------- building-block squeezes
 * The compiled form of the two squeezes of pipeloom.schedule.search.vsqueeze (the Python functions stay the
 * specification; tests/schedule/test_vblock_c.py holds both to identical slot tables):
 *
 * vblock_squeeze(pp, m, ntypes, T, xm, cap, jobs, deps, movable, warm) -> T'   (vsqueeze._squeeze_py)
 * vblock_squeeze_w(pp, m, T, dm, cap, jobs, deps) -> T'                           (vsqueeze._squeeze_implicit_w_py)
 *   T: the slot table flattened, T[(d * ntypes + k) * m + j] (ntypes 6 or 4; 4 for squeeze_w); xm: per device
 *   the memory change counted at each of its ntypes types' slots (vsqueeze._type_mem); dm: per device the
 *   memory change of its 6 types; jobs: the walk of vsqueeze._unsteady_jobs as (t, d, k, j, cool) tuples,
 *   in order; deps: per device and type (pp * 6) the (device, type) pairs of vsqueeze._dep_table, flattened as
 *   4 ints (d1, k1, d2, k2; -1 where absent); movable: the types that may move.
 * The tables come from vsqueeze (made there once for both forms); each function here writes its move rule once.
 */
static int vb_parse_common(PyObject *o_T, Py_ssize_t nT, PyObject *o_dm, Py_ssize_t ndm, Py_ssize_t pp,
                           PyObject *o_jobs, PyObject *o_deps, long **T, double **dm, long **jobs, Py_ssize_t *njobs,
                           long **deps) {
    if (!(*T = as_longs(o_T, nT, "T")) || !(*dm = as_doubles(o_dm, ndm, "memory changes")) ||
        !(*deps = as_longs(o_deps, 4 * 6 * pp, "deps")))
        return -1;
    PyObject *fj = PySequence_Fast(o_jobs, "jobs");
    if (!fj) return -1;
    *njobs = PySequence_Fast_GET_SIZE(fj);
    *jobs = malloc((size_t)(*njobs ? *njobs : 1) * 5 * sizeof(long));
    if (!*jobs) {
        Py_DECREF(fj);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *njobs; i++) {
        long *x = *jobs + 5 * i;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fj, i), "lllll", x, x + 1, x + 2, x + 3, x + 4)) {
            Py_DECREF(fj);
            return -1;
        }
    }
    Py_DECREF(fj);
    return 0;
}

/* vsqueeze._deps: the row's previous job and the jobs that complete the events the job needs */
static inline long vb_dep(const long *T, long ntypes, long m, const long *deps, long d, long k, long j) {
    long dep = j ? T[(d * ntypes + k) * m + j - 1] : -1;
    const long *x = deps + 4 * (d * 6 + k);
    for (int h = 0; h < 2; h++) {
        if (x[2 * h] < 0) continue;
        long v = T[(x[2 * h] * ntypes + x[2 * h + 1]) * m + j];
        if (v > dep) dep = v;
    }
    return dep;
}

static PyObject *vb_result(const long *T, Py_ssize_t n) {
    PyObject *l = PyList_New(n);
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(T[i]);
        if (!v) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *vblock_squeeze(PyObject *self, PyObject *args) {
    (void)self;
    long pp, m, ntypes;
    double cap;
    int warm;
    PyObject *o_T, *o_xm, *o_jobs, *o_deps, *o_mov;
    if (!PyArg_ParseTuple(args, "lllOOdOOOp", &pp, &m, &ntypes, &o_T, &o_xm, &cap, &o_jobs, &o_deps, &o_mov, &warm))
        return NULL;
    if (pp < 1 || m < 1 || (ntypes != 4 && ntypes != 6)) {
        PyErr_SetString(PyExc_ValueError, "vblock_squeeze: pp, m >= 1 and ntypes 4 or 6");
        return NULL;
    }
    const Py_ssize_t nT = pp * ntypes * m;
    long *T = NULL, *jobs = NULL, *deps = NULL, *mov = NULL;
    double *xm = NULL, *run = NULL, *delta = NULL;
    unsigned char *occ = NULL;
    Py_ssize_t njobs = 0;
    PyObject *result = NULL;
    if (vb_parse_common(o_T, nT, o_xm, pp * ntypes, pp, o_jobs, o_deps, &T, &xm, &jobs, &njobs, &deps) < 0) goto done;
    if (!(mov = as_longs(o_mov, ntypes, "movable"))) goto done;
    long horizon = 0;
    for (Py_ssize_t i = 0; i < nT; i++) {
        if (T[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze: negative slot");
            goto done;
        }
        if (T[i] > horizon) horizon = T[i];
    }
    horizon += 2;
    for (Py_ssize_t i = 0; i < njobs; i++) {
        long *x = jobs + 5 * i;
        if (x[1] < 0 || x[1] >= pp || x[2] < 0 || x[2] >= ntypes || x[3] < 0 || x[3] >= m) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze: job out of range");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < 4 * 6 * pp; i += 2)
        if (deps[i] >= pp || (deps[i] >= 0 && (deps[i + 1] < 0 || deps[i + 1] >= 4))) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze: dependency out of range");
            goto done;
        }
    occ = calloc((size_t)pp * horizon, 1);
    run = malloc((size_t)pp * horizon * sizeof(double));
    delta = malloc((size_t)(horizon + 1) * sizeof(double));
    if (!occ || !run || !delta) {
        PyErr_NoMemory();
        goto done;
    }
    /* the memory a device holds at each slot */
    for (long d = 0; d < pp; d++) {
        for (long t = 0; t <= horizon; t++) delta[t] = 0.0;
        for (long k = 0; k < ntypes; k++) {
            double x = xm[d * ntypes + k];
            for (long j = 0; j < m; j++) {
                long t = T[(d * ntypes + k) * m + j];
                occ[d * horizon + t] = 1;
                delta[t] += x;
            }
        }
        double cur = 0.0;
        for (long t = 0; t < horizon; t++) {
            cur += delta[t];
            run[d * horizon + t] = cur;
        }
    }
    const double lim = cap + 1e-9;
    for (Py_ssize_t i = 0; i < njobs; i++) {
        const long *x = jobs + 5 * i;
        long t = x[0], d = x[1], k = x[2], j = x[3], cool = x[4];
        if (!mov[k] || !(warm || cool)) continue;
        if (t < 0 || t >= horizon) continue;
        long dep = vb_dep(T, ntypes, m, deps, d, k, j);
        const double dx = xm[d * ntypes + k];
        unsigned char *o = occ + d * horizon;
        double *r = run + d * horizon;
        for (long s = dep + 1 < 0 ? 0 : dep + 1; s < t; s++) {
            if (o[s]) continue;
            if (dx > 0) {
                double mx = r[s];
                for (long u = s + 1; u < t; u++)
                    if (r[u] > mx) mx = r[u];
                if (mx + dx > lim) continue;
            }
            o[t] = 0;
            o[s] = 1;
            for (long u = s; u < t; u++) r[u] += dx;
            T[(d * ntypes + k) * m + j] = s;
            break;
        }
    }
    result = vb_result(T, nT);
done:
    free(T); free(jobs); free(deps); free(mov); free(xm); free(run); free(delta); free(occ);
    return result;
}

/* vsqueeze._w_walk: THE walk of one row's memory with W in its free slots (chunk 1's first), from slot s on,
   from the state (s1, s0, lv) held before s; past slot t it stops where its state equals the old one. 1 and
   *pk = the peak over the job slots walked; 0 as soon as one exceeds cap (unless update: then the states are
   rewritten instead). vb_w_states (the whole row) and the incremental check of a move are this walk. */
static int vb_w_walk(const long *row, Py_ssize_t n, const double *dm, long *s1, long *s0, double *lv, Py_ssize_t s,
                     Py_ssize_t t, double cap, int update, double *pk) {
    long due1 = 0, due0 = 0;
    double cur = 0.0, p = 0.0;
    const double lim = cap + 1e-9;
    if (s) due1 = s1[s - 1], due0 = s0[s - 1], cur = lv[s - 1];
    for (Py_ssize_t i = s; i < n; i++) {
        long k = row[i];
        if (k < 0) {
            if (due1) {
                due1 -= 1;
                cur += dm[4];
            } else if (due0) {
                due0 -= 1;
                cur += dm[5];
            }
        } else {
            cur += dm[k];
            if (k == 2)
                due1 += 1;
            else if (k == 3)
                due0 += 1;
            if (cur > p) p = cur;
            if (cur > lim && !update) return 0;
        }
        if (i > t && due1 == s1[i] && due0 == s0[i] && fabs(cur - lv[i]) <= 1e-12) break;
        if (update) s1[i] = due1, s0[i] = due0, lv[i] = cur;
    }
    *pk = p;
    return 1;
}

/* vsqueeze._w_states: the walk over the whole row, its states rewritten; the peak */
static double vb_w_states(const long *row, Py_ssize_t n, const double *dm, long *s1, long *s0, double *lv) {
    double pk = 0.0;
    vb_w_walk(row, n, dm, s1, s0, lv, 0, n, HUGE_VAL, 1, &pk);
    return pk;
}

static PyObject *vblock_squeeze_w(PyObject *self, PyObject *args) {
    (void)self;
    long pp, m;
    double cap;
    PyObject *o_T, *o_dm, *o_jobs, *o_deps;
    if (!PyArg_ParseTuple(args, "llOOdOO", &pp, &m, &o_T, &o_dm, &cap, &o_jobs, &o_deps)) return NULL;
    if (pp < 1 || m < 1) {
        PyErr_SetString(PyExc_ValueError, "vblock_squeeze_w: pp and m must be >= 1");
        return NULL;
    }
    const long ntypes = 4;
    const Py_ssize_t nT = pp * ntypes * m;
    long *T = NULL, *jobs = NULL, *deps = NULL, *rows = NULL, *s1 = NULL, *s0 = NULL;
    double *dm = NULL, *lv = NULL;
    unsigned char *fast = NULL;
    Py_ssize_t njobs = 0;
    PyObject *result = NULL;
    if (vb_parse_common(o_T, nT, o_dm, 6 * pp, pp, o_jobs, o_deps, &T, &dm, &jobs, &njobs, &deps) < 0) goto done;
    long horizon = 0;
    for (Py_ssize_t i = 0; i < nT; i++) {
        if (T[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze_w: negative slot");
            goto done;
        }
        if (T[i] > horizon) horizon = T[i];
    }
    horizon += 1;
    for (Py_ssize_t i = 0; i < njobs; i++) {
        long *x = jobs + 5 * i;
        if (x[1] < 0 || x[1] >= pp || x[2] < 0 || x[2] >= ntypes || x[3] < 0 || x[3] >= m || x[0] < 0 ||
            x[0] >= horizon) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze_w: job out of range");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < 4 * 6 * pp; i += 2)
        if (deps[i] >= pp || (deps[i] >= 0 && (deps[i + 1] < 0 || deps[i + 1] >= 4))) {
            PyErr_SetString(PyExc_ValueError, "vblock_squeeze_w: dependency out of range");
            goto done;
        }
    const Py_ssize_t n = horizon + 2 * m + 2; /* room for the W tail */
    rows = malloc((size_t)pp * n * sizeof(long));
    s1 = malloc((size_t)pp * n * sizeof(long));
    s0 = malloc((size_t)pp * n * sizeof(long));
    lv = malloc((size_t)pp * n * sizeof(double));
    fast = malloc((size_t)pp);
    if (!rows || !s1 || !s0 || !lv || !fast) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < pp * n; i++) rows[i] = -1;
    for (long d = 0; d < pp; d++)
        for (long k = 0; k < 4; k++)
            for (long j = 0; j < m; j++) rows[d * n + T[(d * 4 + k) * m + j]] = k;
    const double lim = cap + 1e-9;
    for (long d = 0; d < pp; d++)
        fast[d] = vb_w_states(rows + d * n, n, dm + 6 * d, s1 + d * n, s0 + d * n, lv + d * n) <= lim;
    for (Py_ssize_t i = 0; i < njobs; i++) {
        const long *x = jobs + 5 * i;
        long t = x[0], d = x[1], k = x[2], j = x[3];
        if (!x[4]) continue;
        long dep = vb_dep(T, ntypes, m, deps, d, k, j);
        long *row = rows + d * n, *r1 = s1 + d * n, *r0 = s0 + d * n;
        double *rl = lv + d * n, p;
        const double *dmd = dm + 6 * d;
        for (long s = dep + 1 < 0 ? 0 : dep + 1; s < t; s++) {
            if (row[s] >= 0) continue;
            row[s] = k, row[t] = -1;
            int ok;
            if (fast[d]) {
                ok = vb_w_walk(row, n, dmd, r1, r0, rl, s, t, cap, 0, &p);
                if (ok) vb_w_walk(row, n, dmd, r1, r0, rl, s, t, cap, 1, &p);
            } else { /* the whole row (its states are rewritten; they are read again only once a move is kept) */
                ok = vb_w_states(row, n, dmd, r1, r0, rl) <= lim;
                if (ok) fast[d] = 1;
            }
            if (ok) {
                T[(d * 4 + k) * m + j] = s;
                break;
            }
            row[s] = -1, row[t] = k;
        }
    }
    result = vb_result(T, nT);
done:
    free(T); free(jobs); free(deps); free(rows); free(s1); free(s0); free(dm); free(lv); free(fast);
    return result;
}

static PyMethodDef methods[] = {
    {"run_pass", run_pass, METH_VARARGS, "One greedy pass (see pipeloom.schedule.search.greedy)."},
    {"proven_valid", proven_valid, METH_VARARGS, "The validator's witness check (see pipeloom.schedule.validate)."},
    {"time_order", time_order, METH_VARARGS, "Time a fixed per-device order (see pipeloom.sim.kernel)."},
    {"vblock_squeeze", vblock_squeeze, METH_VARARGS, "vsqueeze._squeeze, compiled (see pipeloom.schedule.search.vsqueeze)."},
    {"vblock_squeeze_w", vblock_squeeze_w, METH_VARARGS,
     "vsqueeze._squeeze_implicit_w, compiled (see pipeloom.schedule.search.vsqueeze)."},
    {"board_replay", board_replay, METH_VARARGS, "Place jobs in a given order on the compiled board (for tests)."},
    {"lockstep_pass", lockstep_pass, METH_VARARGS,
     "One lock-step pass on the list-scheduling board (see pipeloom.schedule.search.lockstep)."},
    {"paced_pass", paced_pass, METH_VARARGS, "One paced pass on the list-scheduling board (see pipeloom.schedule.search.paced)."},
    {"template_pass", template_pass, METH_VARARGS,
     "One template pass on the list-scheduling board (see pipeloom.schedule.zb_looped)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_accel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__accel(void) { return PyModule_Create(&module); }
