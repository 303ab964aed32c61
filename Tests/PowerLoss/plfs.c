/*
 * plfs: a power-loss file system for tests (FUSE, libfuse3's high-level API, single-threaded).
 *
 * It keeps everything in memory, twice: what the programs using it see (the current state) and what a disk would
 * still hold after a power cut (the durable state). The durable state moves only as POSIX promises:
 *   - a file's data and size: on fsync or fdatasync of that file;
 *   - its extended attributes: on fsync of that file (not fdatasync);
 *   - a directory's entries (create, mkdir, link, unlink, rename): on fsync of that directory; until then they
 *     are a log, and a cut may keep any prefix of it (a journal commits metadata in order);
 *   - fallocate and truncate change the current size and data like writes do.
 * Shared mmap works (the kernel writes the pages back to us as writes; unsynced, like any write).
 *
 * A cut ("power loss") happens after the operation a --cut spec names: the durable state is written to --save as
 * an image and the process exits at once, so the connection aborts and the program using the mount learns nothing
 * more (every later call fails). With --torn, each page written since the last sync of its file is kept or lost
 * (seeded), each file's size is the synced or the current one, and each directory keeps a seeded prefix of its
 * unsynced entry log. Without it, everything unsynced is lost.
 *
 * --lie SUFFIX: files whose name ends with SUFFIX sit on a disk that lies about fdatasync: it makes the new size
 * durable but drops the data (pages never synced before read as zeros after a cut, rewritten pages keep their old
 * content), with probability --lie-rate (default 1). A full fsync stays honest: a disk that lies to that too can
 * spoil a file after it was finished and renamed, which no program can tell before it reads the file again.
 *
 * A clean unmount (no cut) saves the current state as the image: a clean shutdown writes everything back.
 *
 * --mkdir NAME: a folder in the root, there (durably) before anything runs.
 *
 * Usage: plfs MOUNTPOINT [--load IMAGE] [--save IMAGE] [--trace FILE] [--seed N] [--torn]
 *             [--mkdir NAME]... [--cut KIND:SUFFIX:N[+M]]... [--lie SUFFIX] [--lie-rate R]
 *   N may be followed by +M: the cut comes M changing operations (writes not counted) after the spec is met.
 *   KIND: write fsync fdatasync fsyncdir create mkdir link unlink rename setxattr truncate fallocate any,
 *   or bytes (SUFFIX:N = after the write that brings the bytes written to files ending in SUFFIX to N or more).
 *   A name matches SUFFIX when its last path component ends with it (rename and link match their target).
 *   The trace has one line per changing operation: "SEQ KIND NAME" (rename and link: "SEQ KIND FROM TO"), where
 *   NAME is the last path component; a cut appends "cut SEQ".
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

typedef struct {
    unsigned char *data;
    size_t size, cap;
} buf_t;

typedef struct xattr {
    char *name;
    buf_t value;
    struct xattr *next;
} xattr_t;

struct node;
typedef struct dent {
    char *name;
    struct node *node;
    struct dent *next;
} dent_t;

/* One entry change of a directory since its last fsync: name -> node (NULL: removed). `joined`: this change and
 * the next one are one operation (a rename within the directory), kept or lost together. */
typedef struct dop {
    char *name;
    struct node *node;
    int joined;
    struct dop *next;
} dop_t;

typedef struct node {
    uint64_t id;
    int is_dir;
    mode_t mode;
    int nlink;
    struct timespec mtime;
    /* files */
    buf_t cur, dur;
    unsigned char *dirty; /* one byte per page of cur: written since the last sync */
    size_t dirty_pages;
    xattr_t *xcur, *xdur;
    int xdirty;
    /* directories */
    dent_t *ents, *dents;
    dop_t *log, *log_tail;
    struct node *all_next;
    /* while an image is written: the entries it gets, and whether a directory of the image reaches it */
    dent_t *img_ents;
    int reached;
} node_t;

static node_t *root, *all_nodes;
static uint64_t next_id = 1;
static const char *save_path, *trace_path, *load_path;
static FILE *trace;
static uint64_t seq;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static int torn;
static const char *lie_suffix;
static double lie_rate = 1.0;

typedef struct {
    char kind[16];
    char suffix[256];
    uint64_t n, count;
    /* +M: the cut comes M changing operations other than writes after the spec is met (a step of whatever began
     * there: writes are the transfers', running beside it). -1 until met. */
    long plus, remaining;
} cut_t;
static cut_t cuts[32];
static int ncuts;

static uint64_t rng(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int coin(void) { return (int)(rng() & 1); }

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "plfs: out of memory\n");
        _exit(3);
    }
    return p;
}

static void buf_reserve(buf_t *b, size_t size) {
    if (size <= b->cap) return;
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < size) cap *= 2;
    b->data = realloc(b->data, cap);
    if (!b->data) {
        fprintf(stderr, "plfs: out of memory\n");
        _exit(3);
    }
    memset(b->data + b->cap, 0, cap - b->cap);
    b->cap = cap;
}

/* Sets the size; bytes past the old size read as zeros. */
static void buf_resize(buf_t *b, size_t size) {
    buf_reserve(b, size);
    if (size > b->size)
        memset(b->data + b->size, 0, size - b->size);
    else if (size < b->size)
        memset(b->data + size, 0, b->size - size);
    b->size = size;
}

static void buf_copy(buf_t *to, const buf_t *from) {
    buf_resize(to, from->size);
    if (from->size) memcpy(to->data, from->data, from->size);
}

static node_t *new_node(int is_dir, mode_t mode) {
    node_t *n = xmalloc(sizeof *n);
    n->id = next_id++;
    n->is_dir = is_dir;
    n->mode = mode;
    clock_gettime(CLOCK_REALTIME, &n->mtime);
    n->all_next = all_nodes;
    all_nodes = n;
    return n;
}

static void mark_dirty(node_t *n, size_t from, size_t to) {
    if (to <= from) return;
    size_t pages = (n->cur.size + PAGE - 1) / PAGE;
    size_t need = (to + PAGE - 1) / PAGE;
    if (need > pages) pages = need;
    if (pages > n->dirty_pages) {
        n->dirty = realloc(n->dirty, pages);
        memset(n->dirty + n->dirty_pages, 0, pages - n->dirty_pages);
        n->dirty_pages = pages;
    }
    for (size_t p = from / PAGE; p < need; p++) n->dirty[p] = 1;
}

/* ---- directories ---- */

static dent_t *find_dent(dent_t *list, const char *name) {
    for (; list; list = list->next)
        if (strcmp(list->name, name) == 0) return list;
    return NULL;
}

static void set_dent(dent_t **list, const char *name, node_t *node) {
    dent_t **at = list;
    for (; *at; at = &(*at)->next) {
        if (strcmp((*at)->name, name) == 0) {
            if (node) {
                (*at)->node = node;
            } else {
                dent_t *gone = *at;
                *at = gone->next;
                free(gone->name);
                free(gone);
            }
            return;
        }
    }
    if (!node) return;
    dent_t *d = xmalloc(sizeof *d);
    d->name = strdup(name);
    d->node = node;
    d->next = *list;
    *list = d;
}

/* Changes a current entry and logs it (durable at the directory's fsync). */
static void dir_change(node_t *dir, const char *name, node_t *node) {
    dent_t *old = find_dent(dir->ents, name);
    if (old) old->node->nlink--;
    if (node) node->nlink++;
    set_dent(&dir->ents, name, node);
    dop_t *op = xmalloc(sizeof *op);
    op->name = strdup(name);
    op->node = node;
    op->joined = 0;
    if (dir->log_tail)
        dir->log_tail->next = op;
    else
        dir->log = op;
    dir->log_tail = op;
}

static void free_dents(dent_t *d) {
    while (d) {
        dent_t *next = d->next;
        free(d->name);
        free(d);
        d = next;
    }
}

static dent_t *copy_dents(dent_t *d) {
    dent_t *out = NULL;
    for (; d; d = d->next) set_dent(&out, d->name, d->node);
    return out;
}

static void clear_log(node_t *dir) {
    dop_t *op = dir->log;
    while (op) {
        dop_t *next = op->next;
        free(op->name);
        free(op);
        op = next;
    }
    dir->log = dir->log_tail = NULL;
}

/* ---- paths ---- */

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static node_t *lookup(const char *path) {
    node_t *at = root;
    char part[4096];
    const char *p = path;
    while (*p == '/') p++;
    while (*p) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= sizeof part || !at->is_dir) return NULL;
        memcpy(part, p, len);
        part[len] = 0;
        dent_t *d = find_dent(at->ents, part);
        if (!d) return NULL;
        at = d->node;
        p += len;
        while (*p == '/') p++;
    }
    return at;
}

static node_t *parent_of(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    char *slash = strrchr(copy, '/');
    if (!slash) return NULL;
    if (slash == copy)
        copy[1] = 0;
    else
        *slash = 0;
    node_t *dir = lookup(copy);
    return dir && dir->is_dir ? dir : NULL;
}

static node_t *node_for(const char *path, struct fuse_file_info *fi) {
    if (fi && fi->fh) return (node_t *)(uintptr_t)fi->fh;
    return path ? lookup(path) : NULL;
}

static char name_buffer[4096];
/* The name an open file was last seen under (for the trace of writes and syncs through a descriptor). */
static const char *name_of(node_t *n, const char *path) {
    if (path) return path;
    for (node_t *d = all_nodes; d; d = d->all_next) {
        if (!d->is_dir) continue;
        for (dent_t *e = d->ents; e; e = e->next)
            if (e->node == n) {
                snprintf(name_buffer, sizeof name_buffer, "%s", e->name);
                return name_buffer;
            }
    }
    return "(unlinked)";
}

/* ---- images ---- */

typedef struct {
    node_t *node;
    dent_t *ents; /* the entries in this image */
    buf_t *data;
    xattr_t *x;
} image_node_t;

static void reach(node_t *n) {
    if (n->reached) return;
    n->reached = 1;
    if (n->is_dir)
        for (dent_t *d = n->img_ents; d; d = d->next) reach(d->node);
}

/* Writes what a boot would find (durable) or what a clean shutdown leaves (current). Only what the image's
 * directories reach is in it: a file whose name was never made durable is gone after a reboot. */
static int write_image(const char *path, int durable) {
    char temporary[4200];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    FILE *f = fopen(temporary, "wb");
    if (!f) return -1;
    fprintf(f, "PLFS1\n");
    /* Each directory: its durable entries plus (torn) a seeded prefix of its log. */
    for (node_t *n = all_nodes; n; n = n->all_next) {
        n->reached = 0;
        if (!n->is_dir) continue;
        if (durable) {
            n->img_ents = copy_dents(n->dents);
            /* A prefix of whole operations: a rename within one directory is atomic in a journal (one name or
             * the other, never both or neither). */
            size_t len = 0;
            for (dop_t *op = n->log; op; op = op->next)
                if (!op->joined) len++;
            size_t keep = torn && len ? (size_t)(rng() % (len + 1)) : 0;
            dop_t *op = n->log;
            for (size_t i = 0; i < keep; i++) {
                int joined;
                do {
                    joined = op->joined;
                    set_dent(&n->img_ents, op->name, op->node);
                    op = op->next;
                } while (joined && op);
            }
        } else {
            n->img_ents = copy_dents(n->ents);
        }
    }
    reach(root);
    for (node_t *n = all_nodes; n; n = n->all_next) {
        if (!n->reached) continue;
        if (n->is_dir) {
            fprintf(f, "D %" PRIu64 " %o\n", n->id, (unsigned)n->mode);
            for (dent_t *d = n->img_ents; d; d = d->next)
                fprintf(f, "E %" PRIu64 " %zu %s\n", d->node->id, strlen(d->name), d->name);
        } else {
            buf_t data = {0};
            xattr_t *x = durable ? n->xdur : n->xcur;
            if (durable) {
                buf_copy(&data, &n->dur);
                if (torn) {
                    size_t size = coin() ? n->cur.size : n->dur.size;
                    buf_resize(&data, size);
                    for (size_t p = 0; p < n->dirty_pages; p++) {
                        if (!n->dirty[p] || !coin()) continue;
                        size_t from = p * PAGE;
                        if (from >= size) continue;
                        size_t to = from + PAGE;
                        if (to > size) to = size;
                        if (to > n->cur.size) to = n->cur.size;
                        if (to > from) memcpy(data.data + from, n->cur.data + from, to - from);
                    }
                    if (n->xdirty && coin()) x = n->xcur;
                }
            } else {
                buf_copy(&data, &n->cur);
            }
            size_t nx = 0;
            for (xattr_t *i = x; i; i = i->next) nx++;
            fprintf(f, "F %" PRIu64 " %o %zu %zu\n", n->id, (unsigned)n->mode, data.size, nx);
            for (xattr_t *i = x; i; i = i->next) {
                fprintf(f, "%zu %zu\n", strlen(i->name), i->value.size);
                fwrite(i->name, 1, strlen(i->name), f);
                fwrite(i->value.data, 1, i->value.size, f);
            }
            if (data.size) fwrite(data.data, 1, data.size, f);
            fprintf(f, "\n");
            free(data.data);
        }
    }
    for (node_t *n = all_nodes; n; n = n->all_next)
        if (n->is_dir) {
            free_dents(n->img_ents);
            n->img_ents = NULL;
        }
    fprintf(f, "END\n");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return rename(temporary, path);
}

static node_t *node_by_id(uint64_t id) {
    for (node_t *n = all_nodes; n; n = n->all_next)
        if (n->id == id) return n;
    return NULL;
}

/* Loads an image: everything in it is durable. Nodes no directory reaches are dropped (not reachable after a
 * reboot). Directories are listed before their entries' targets may be, so entries are resolved in a second pass. */
static int load_image(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char line[8192];
    if (!fgets(line, sizeof line, f) || strcmp(line, "PLFS1\n") != 0) return -1;
    typedef struct pending {
        uint64_t dir, target;
        char *name;
        struct pending *next;
    } pending_t;
    pending_t *pending = NULL;
    uint64_t current_dir = 0, max_id = 1;
    while (fgets(line, sizeof line, f)) {
        if (strcmp(line, "END\n") == 0) break;
        uint64_t id;
        unsigned mode;
        if (line[0] == 'D') {
            sscanf(line, "D %" SCNu64 " %o", &id, &mode);
            node_t *n = id == 1 ? root : new_node(1, mode);
            n->id = id;
            n->mode = mode;
            current_dir = id;
        } else if (line[0] == 'E') {
            size_t len;
            int skip = 0;
            sscanf(line, "E %" SCNu64 " %zu %n", &id, &len, &skip);
            pending_t *p = xmalloc(sizeof *p);
            p->dir = current_dir;
            p->target = id;
            p->name = strndup(line + skip, len);
            p->next = pending;
            pending = p;
        } else if (line[0] == 'F') {
            size_t size, nx;
            sscanf(line, "F %" SCNu64 " %o %zu %zu", &id, &mode, &size, &nx);
            node_t *n = new_node(0, mode);
            n->id = id;
            for (size_t i = 0; i < nx; i++) {
                size_t nl, vl;
                if (!fgets(line, sizeof line, f) || sscanf(line, "%zu %zu", &nl, &vl) != 2) return -1;
                xattr_t *x = xmalloc(sizeof *x);
                x->name = xmalloc(nl + 1);
                if (fread(x->name, 1, nl, f) != nl) return -1;
                buf_resize(&x->value, vl);
                if (vl && fread(x->value.data, 1, vl, f) != vl) return -1;
                x->next = n->xcur;
                n->xcur = x;
                xattr_t *y = xmalloc(sizeof *y);
                y->name = strdup(x->name);
                buf_copy(&y->value, &x->value);
                y->next = n->xdur;
                n->xdur = y;
            }
            buf_resize(&n->cur, size);
            if (size && fread(n->cur.data, 1, size, f) != size) return -1;
            buf_copy(&n->dur, &n->cur);
            fgetc(f); /* newline */
        } else {
            return -1;
        }
        if (id > max_id) max_id = id;
    }
    fclose(f);
    for (pending_t *p = pending; p; p = p->next) {
        node_t *dir = node_by_id(p->dir), *target = node_by_id(p->target);
        if (!dir || !target) return -1;
        set_dent(&dir->ents, p->name, target);
        set_dent(&dir->dents, p->name, target);
        target->nlink++;
    }
    next_id = max_id + 1;
    return 0;
}

/* ---- cuts and the trace ---- */

static void cut_now(void) {
    if (trace) {
        fprintf(trace, "cut %" PRIu64 "\n", seq);
        fflush(trace);
    }
    if (save_path && write_image(save_path, 1) != 0) {
        fprintf(stderr, "plfs: cannot save the image at %s\n", save_path);
        _exit(4);
    }
    /* Gone at once: the kernel aborts the connection, and the program using the mount learns nothing more. */
    _exit(0);
}

static int suffix_matches(const char *name, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    return s <= n && strcmp(name + n - s, suffix) == 0;
}

/* Records an operation that changed something; cuts if a spec says so. `bytes` counts toward "bytes" specs. */
static void after(const char *kind, const char *path, const char *to, size_t bytes) {
    seq++;
    const char *name = path ? base_name(path) : "?";
    const char *target = to ? base_name(to) : name;
    if (trace) {
        if (to)
            fprintf(trace, "%" PRIu64 " %s %s %s\n", seq, kind, name, target);
        else
            fprintf(trace, "%" PRIu64 " %s %s\n", seq, kind, name);
    }
    for (int i = 0; i < ncuts; i++) {
        cut_t *c = &cuts[i];
        if (c->remaining >= 0) {
            if (strcmp(kind, "write") == 0) continue;
            if (c->remaining-- == 0) cut_now();
            continue;
        }
        if (!suffix_matches(target, c->suffix)) continue;
        if (strcmp(c->kind, "bytes") == 0) {
            if (strcmp(kind, "write") != 0) continue;
            c->count += bytes;
        } else if (strcmp(c->kind, "any") == 0 || strcmp(c->kind, kind) == 0) {
            c->count++;
        } else {
            continue;
        }
        if (c->count >= c->n) {
            if (c->plus == 0) cut_now();
            c->remaining = c->plus - 1;
        }
    }
}

/* ---- operations ---- */

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->use_ino = 1;
    cfg->hard_remove = 1;
    cfg->nullpath_ok = 1;
    cfg->entry_timeout = 0;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->kernel_cache = 0;
    return NULL;
}

static void op_destroy(void *data) {
    (void)data;
    if (trace) {
        fprintf(trace, "unmounted %" PRIu64 "\n", seq);
        fflush(trace);
    }
    if (save_path && write_image(save_path, 0) != 0) fprintf(stderr, "plfs: cannot save the image at %s\n", save_path);
}

static void fill_stat(node_t *n, struct stat *st) {
    memset(st, 0, sizeof *st);
    st->st_ino = n->id;
    st->st_mode = n->mode;
    st->st_nlink = n->is_dir ? 2 : (n->nlink > 0 ? n->nlink : 0);
    st->st_size = n->is_dir ? 4096 : (off_t)n->cur.size;
    st->st_blksize = PAGE;
    st->st_blocks = (st->st_size + 511) / 512;
    st->st_mtim = st->st_ctim = st->st_atim = n->mtime;
    st->st_uid = getuid();
    st->st_gid = getgid();
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    fill_stat(n, st);
    return 0;
}

static int op_readdir(const char *path, void *out, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
    (void)off;
    (void)flags;
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (!n->is_dir) return -ENOTDIR;
    fill(out, ".", NULL, 0, 0);
    fill(out, "..", NULL, 0, 0);
    for (dent_t *d = n->ents; d; d = d->next) {
        struct stat st;
        fill_stat(d->node, &st);
        fill(out, d->name, &st, 0, 0);
    }
    return 0;
}

static int make(const char *path, mode_t mode, int is_dir, node_t **made) {
    node_t *dir = parent_of(path);
    if (!dir) return -ENOENT;
    if (find_dent(dir->ents, base_name(path))) return -EEXIST;
    node_t *n = new_node(is_dir, mode | (is_dir ? S_IFDIR : S_IFREG));
    dir_change(dir, base_name(path), n);
    clock_gettime(CLOCK_REALTIME, &dir->mtime);
    *made = n;
    return 0;
}

static int op_mkdir(const char *path, mode_t mode) {
    node_t *n;
    int r = make(path, mode, 1, &n);
    if (r == 0) after("mkdir", path, NULL, 0);
    return r;
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    node_t *n;
    int r = make(path, mode, 0, &n);
    if (r != 0) return r;
    fi->fh = (uintptr_t)n;
    after("create", path, NULL, 0);
    return 0;
}

static int op_mknod(const char *path, mode_t mode, dev_t dev) {
    (void)dev;
    if (!S_ISREG(mode)) return -EPERM;
    node_t *n;
    int r = make(path, mode & 07777, 0, &n);
    if (r == 0) after("create", path, NULL, 0);
    return r;
}

static int op_open(const char *path, struct fuse_file_info *fi) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    fi->fh = (uintptr_t)n;
    return 0;
}

static int op_opendir(const char *path, struct fuse_file_info *fi) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    if (!n->is_dir) return -ENOTDIR;
    fi->fh = (uintptr_t)n;
    return 0;
}

static int op_unlink(const char *path) {
    node_t *dir = parent_of(path);
    if (!dir) return -ENOENT;
    dent_t *d = find_dent(dir->ents, base_name(path));
    if (!d) return -ENOENT;
    if (d->node->is_dir) return -EISDIR;
    dir_change(dir, base_name(path), NULL);
    after("unlink", path, NULL, 0);
    return 0;
}

static int op_rmdir(const char *path) {
    node_t *dir = parent_of(path);
    if (!dir) return -ENOENT;
    dent_t *d = find_dent(dir->ents, base_name(path));
    if (!d) return -ENOENT;
    if (!d->node->is_dir) return -ENOTDIR;
    if (d->node->ents) return -ENOTEMPTY;
    dir_change(dir, base_name(path), NULL);
    after("rmdir", path, NULL, 0);
    return 0;
}

static int op_rename(const char *from, const char *to, unsigned int flags) {
    node_t *fdir = parent_of(from), *tdir = parent_of(to);
    if (!fdir || !tdir) return -ENOENT;
    dent_t *d = find_dent(fdir->ents, base_name(from));
    if (!d) return -ENOENT;
    if (flags & ~RENAME_NOREPLACE) return -EINVAL;
    dent_t *existing = find_dent(tdir->ents, base_name(to));
    if (existing && (flags & RENAME_NOREPLACE)) return -EEXIST;
    node_t *n = d->node;
    if (existing && existing->node == n) return 0; /* two names of one file: rename does nothing */
    if (existing && existing->node->is_dir && existing->node->ents) return -ENOTEMPTY;
    dir_change(tdir, base_name(to), n);
    if (tdir == fdir) tdir->log_tail->joined = 1; /* atomic within one directory */
    dir_change(fdir, base_name(from), NULL);
    after("rename", from, to, 0);
    return 0;
}

static int op_link(const char *from, const char *to) {
    node_t *n = lookup(from), *tdir = parent_of(to);
    if (!n || !tdir) return -ENOENT;
    if (n->is_dir) return -EPERM;
    if (find_dent(tdir->ents, base_name(to))) return -EEXIST;
    dir_change(tdir, base_name(to), n);
    after("link", from, to, 0);
    return 0;
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    n->mode = (n->mode & S_IFMT) | (mode & 07777);
    return 0;
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
    (void)uid;
    (void)gid;
    return node_for(path, fi) ? 0 : -ENOENT;
}

static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (tv[1].tv_nsec == UTIME_NOW)
        clock_gettime(CLOCK_REALTIME, &n->mtime);
    else if (tv[1].tv_nsec != UTIME_OMIT)
        n->mtime = tv[1];
    return 0;
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (n->is_dir) return -EISDIR;
    size_t old = n->cur.size;
    buf_resize(&n->cur, (size_t)size);
    /* The page holding the new end changed (its tail is zero now), and every page between the two ends. */
    size_t lo = (size_t)size < old ? (size_t)size : old, hi = (size_t)size < old ? old : (size_t)size;
    mark_dirty(n, lo, hi > lo ? hi : lo + 1);
    clock_gettime(CLOCK_REALTIME, &n->mtime);
    after("truncate", name_of(n, path), NULL, 0);
    return 0;
}

static int op_read(const char *path, char *out, size_t size, off_t off, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if ((size_t)off >= n->cur.size) return 0;
    if ((size_t)off + size > n->cur.size) size = n->cur.size - (size_t)off;
    memcpy(out, n->cur.data + off, size);
    return (int)size;
}

static int op_write(const char *path, const char *in, size_t size, off_t off, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    size_t end = (size_t)off + size;
    if (end > n->cur.size) buf_resize(&n->cur, end);
    memcpy(n->cur.data + off, in, size);
    mark_dirty(n, (size_t)off, end);
    clock_gettime(CLOCK_REALTIME, &n->mtime);
    after("write", name_of(n, path), NULL, size);
    return (int)size;
}

static int op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) return -EOPNOTSUPP;
    size_t end = (size_t)(off + len);
    if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
        size_t stop = end < n->cur.size ? end : n->cur.size;
        if ((size_t)off < stop) {
            memset(n->cur.data + off, 0, stop - (size_t)off);
            mark_dirty(n, (size_t)off, stop);
        }
    }
    if (!(mode & FALLOC_FL_KEEP_SIZE) && end > n->cur.size) {
        size_t old = n->cur.size;
        buf_resize(&n->cur, end);
        mark_dirty(n, old, end);
    }
    after("fallocate", name_of(n, path), NULL, 0);
    return 0;
}

static int is_liar(node_t *n, const char *path) {
    return lie_suffix && suffix_matches(base_name(name_of(n, path)), lie_suffix) &&
           (double)(rng() >> 11) / (double)(1ull << 53) < lie_rate;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (!n->is_dir) {
        if (datasync && is_liar(n, path)) {
            /* The size is made durable, the data is not. */
            size_t old = n->dur.size;
            buf_resize(&n->dur, n->cur.size);
            (void)old;
        } else {
            buf_copy(&n->dur, &n->cur);
        }
        memset(n->dirty, 0, n->dirty_pages);
        if (!datasync) {
            /* The extended attributes go with fsync (not fdatasync). */
            xattr_t *x = n->xdur;
            while (x) {
                xattr_t *next = x->next;
                free(x->name);
                free(x->value.data);
                free(x);
                x = next;
            }
            n->xdur = NULL;
            for (xattr_t *i = n->xcur; i; i = i->next) {
                xattr_t *y = xmalloc(sizeof *y);
                y->name = strdup(i->name);
                buf_copy(&y->value, &i->value);
                y->next = n->xdur;
                n->xdur = y;
            }
            n->xdirty = 0;
        }
    }
    after(datasync ? "fdatasync" : "fsync", name_of(n, path), NULL, 0);
    return 0;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)datasync;
    node_t *n = node_for(path, fi);
    if (!n) return -ENOENT;
    if (!n->is_dir) return -ENOTDIR;
    free_dents(n->dents);
    n->dents = copy_dents(n->ents);
    clear_log(n);
    after("fsyncdir", n == root ? "/" : name_of(n, path), NULL, 0);
    return 0;
}

static xattr_t **find_xattr(node_t *n, const char *name) {
    xattr_t **at = &n->xcur;
    for (; *at; at = &(*at)->next)
        if (strcmp((*at)->name, name) == 0) return at;
    return at;
}

static int op_setxattr(const char *path, const char *name, const char *value, size_t size, int flags) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    xattr_t **at = find_xattr(n, name);
    if (*at && (flags & XATTR_CREATE)) return -EEXIST;
    if (!*at && (flags & XATTR_REPLACE)) return -ENODATA;
    if (!*at) {
        *at = xmalloc(sizeof **at);
        (*at)->name = strdup(name);
    }
    buf_resize(&(*at)->value, size);
    memcpy((*at)->value.data, value, size);
    n->xdirty = 1;
    after("setxattr", path, NULL, 0);
    return 0;
}

static int op_getxattr(const char *path, const char *name, char *value, size_t size) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    xattr_t **at = find_xattr(n, name);
    if (!*at) return -ENODATA;
    if (size == 0) return (int)(*at)->value.size;
    if (size < (*at)->value.size) return -ERANGE;
    memcpy(value, (*at)->value.data, (*at)->value.size);
    return (int)(*at)->value.size;
}

static int op_listxattr(const char *path, char *list, size_t size) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    size_t need = 0;
    for (xattr_t *x = n->xcur; x; x = x->next) need += strlen(x->name) + 1;
    if (size == 0) return (int)need;
    if (size < need) return -ERANGE;
    for (xattr_t *x = n->xcur; x; x = x->next) {
        strcpy(list, x->name);
        list += strlen(x->name) + 1;
    }
    return (int)need;
}

static int op_removexattr(const char *path, const char *name) {
    node_t *n = lookup(path);
    if (!n) return -ENOENT;
    xattr_t **at = find_xattr(n, name);
    if (!*at) return -ENODATA;
    xattr_t *gone = *at;
    *at = gone->next;
    free(gone->name);
    free(gone->value.data);
    free(gone);
    n->xdirty = 1;
    after("setxattr", path, NULL, 0);
    return 0;
}

static int op_statfs(const char *path, struct statvfs *st) {
    (void)path;
    memset(st, 0, sizeof *st);
    st->f_bsize = st->f_frsize = PAGE;
    st->f_blocks = 1u << 26; /* 256 GiB */
    st->f_bfree = st->f_bavail = 1u << 25;
    st->f_files = st->f_ffree = st->f_favail = 1u << 20;
    st->f_namemax = 255;
    return 0;
}

static int op_access(const char *path, int mask) {
    (void)mask;
    return lookup(path) ? 0 : -ENOENT;
}

static const struct fuse_operations operations = {
    .init = op_init,
    .destroy = op_destroy,
    .getattr = op_getattr,
    .readdir = op_readdir,
    .mkdir = op_mkdir,
    .mknod = op_mknod,
    .create = op_create,
    .open = op_open,
    .opendir = op_opendir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .link = op_link,
    .chmod = op_chmod,
    .chown = op_chown,
    .utimens = op_utimens,
    .truncate = op_truncate,
    .read = op_read,
    .write = op_write,
    .fallocate = op_fallocate,
    .fsync = op_fsync,
    .fsyncdir = op_fsyncdir,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
    .statfs = op_statfs,
    .access = op_access,
};

static void usage(void) {
    fprintf(stderr, "usage: plfs MOUNTPOINT [--load IMAGE] [--save IMAGE] [--trace FILE] [--seed N] [--torn] "
                    "[--mkdir NAME]... [--cut KIND:SUFFIX:N[+M]]... [--lie SUFFIX] [--lie-rate R]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *mkdirs[8];
    int nmkdirs = 0;
    if (argc < 2) usage();
    const char *mountpoint = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--torn") == 0) {
            torn = 1;
            continue;
        }
        if (!v) usage();
        i++;
        if (strcmp(a, "--load") == 0) {
            load_path = v;
        } else if (strcmp(a, "--save") == 0) {
            save_path = v;
        } else if (strcmp(a, "--trace") == 0) {
            trace_path = v;
        } else if (strcmp(a, "--seed") == 0) {
            rng_state ^= strtoull(v, NULL, 0) * 0xD1B54A32D192ED03ull;
        } else if (strcmp(a, "--mkdir") == 0) {
            mkdirs[nmkdirs < 8 ? nmkdirs++ : 7] = v;
        } else if (strcmp(a, "--lie") == 0) {
            lie_suffix = v;
        } else if (strcmp(a, "--lie-rate") == 0) {
            lie_rate = strtod(v, NULL);
        } else if (strcmp(a, "--cut") == 0) {
            if (ncuts == 32) usage();
            cut_t *c = &cuts[ncuts++];
            const char *colon = strchr(v, ':');
            const char *last = strrchr(v, ':');
            if (!colon || colon == last || (size_t)(colon - v) >= sizeof c->kind) usage();
            snprintf(c->kind, sizeof c->kind, "%.*s", (int)(colon - v), v);
            snprintf(c->suffix, sizeof c->suffix, "%.*s", (int)(last - colon - 1), colon + 1);
            char *rest;
            c->n = strtoull(last + 1, &rest, 10);
            c->plus = *rest == '+' ? strtol(rest + 1, NULL, 10) : 0;
            c->remaining = -1;
            if (c->n == 0 || c->plus < 0) usage();
        } else {
            usage();
        }
    }
    root = new_node(1, S_IFDIR | 0755);
    if (load_path && load_image(load_path) != 0) {
        fprintf(stderr, "plfs: cannot load the image %s\n", load_path);
        return 2;
    }
    /* Folders the test needs, made durable before anything runs (and before any cut is counted). */
    for (int i = 0; i < nmkdirs; i++) {
        if (find_dent(root->ents, mkdirs[i])) continue;
        node_t *dir = new_node(1, S_IFDIR | 0755);
        set_dent(&root->ents, mkdirs[i], dir);
        set_dent(&root->dents, mkdirs[i], dir);
        dir->nlink++;
    }
    if (trace_path && !(trace = fopen(trace_path, "a"))) {
        fprintf(stderr, "plfs: cannot open the trace %s\n", trace_path);
        return 2;
    }
    char *args[] = {argv[0], (char *)mountpoint, "-f", "-s", "-o", "fsname=plfs,subtype=plfs", NULL};
    int code = fuse_main(6, args, &operations, NULL);
    if (trace) fclose(trace);
    return code;
}
