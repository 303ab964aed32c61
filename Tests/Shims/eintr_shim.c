/*
 * An LD_PRELOAD shim that makes writes to regular files fail with EINTR or come up short, deterministically, so
 * that tests can show a program's write loops retry both (Tests/StitchCLITests/InterruptedWriteTests.swift).
 * Not a SwiftPM target: the test compiles it with `cc -shared -fPIC -O1 -o eintr_shim.so eintr_shim.c -ldl`.
 *
 * Interposes write, pwrite and pwrite64: the calls Stitch (write for the state file, pwrite64 for the part file
 * and the live record) and SQLite (write, pwrite64) make; neither calls writev or pwritev. Only calls from other
 * modules are seen: glibc's own stdio writes go to its internal __write, which is fine, since only regular files
 * are touched and Stitch writes none of its files through stdio.
 *
 * Environment (read once, at load):
 *   STITCH_SHIM_EINTR_EVERY=N  every Nth eligible call returns -1 with errno EINTR and writes nothing (N >= 2;
 *                              1 would fail every retry too, so it is taken as 2)
 *   STITCH_SHIM_SHORT_EVERY=M  every Mth eligible call writes only half the requested bytes (at least 1); a call
 *                              that is both an Nth and an Mth fails with EINTR
 *   STITCH_SHIM_REPORT=PATH    at exit, appends `eintr=E short=S calls=C pid=P` to PATH
 * An eligible call is one on a regular file (fstat, S_ISREG) asking for at least one byte; pipes, sockets and
 * terminals pass straight through. One counter numbers the eligible calls of all threads, so a retry is the
 * next number and a loop that retries always gets on.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);

static _Atomic(write_fn) real_write_fn;
static _Atomic(pwrite_fn) real_pwrite_fn;
static _Atomic(pwrite64_fn) real_pwrite64_fn;

static unsigned long eintr_every;
static unsigned long short_every;
static atomic_ulong calls;
static atomic_ulong eintrs;
static atomic_ulong shorts;

/* dlsym(RTLD_NEXT) on first use (a write may come from another library's constructor, before ours). */
static write_fn real_write(void) {
    write_fn fn = atomic_load(&real_write_fn);
    if (!fn) {
        fn = (write_fn)dlsym(RTLD_NEXT, "write");
        atomic_store(&real_write_fn, fn);
    }
    return fn;
}

static pwrite_fn real_pwrite(void) {
    pwrite_fn fn = atomic_load(&real_pwrite_fn);
    if (!fn) {
        fn = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
        atomic_store(&real_pwrite_fn, fn);
    }
    return fn;
}

static pwrite64_fn real_pwrite64(void) {
    pwrite64_fn fn = atomic_load(&real_pwrite64_fn);
    if (!fn) {
        fn = (pwrite64_fn)dlsym(RTLD_NEXT, "pwrite64");
        atomic_store(&real_pwrite64_fn, fn);
    }
    return fn;
}

static unsigned long every(const char *name) {
    const char *text = getenv(name);
    return text ? strtoul(text, NULL, 10) : 0;
}

__attribute__((constructor)) static void shim_load(void) {
    eintr_every = every("STITCH_SHIM_EINTR_EVERY");
    if (eintr_every == 1) eintr_every = 2;
    short_every = every("STITCH_SHIM_SHORT_EVERY");
}

enum action { PASS, FAIL_EINTR, WRITE_HALF };

/* Decides what to do with a call writing `count` bytes to `fd`. Leaves errno as it was. */
static enum action decide(int fd, size_t count) {
    if ((eintr_every == 0 && short_every == 0) || count == 0) return PASS;
    int saved = errno;
    struct stat info;
    int regular = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
    errno = saved;
    if (!regular) return PASS;
    unsigned long n = atomic_fetch_add(&calls, 1) + 1;
    if (eintr_every && n % eintr_every == 0) {
        atomic_fetch_add(&eintrs, 1);
        return FAIL_EINTR;
    }
    if (short_every && n % short_every == 0 && count >= 2) {
        atomic_fetch_add(&shorts, 1);
        return WRITE_HALF;
    }
    return PASS;
}

ssize_t write(int fd, const void *buffer, size_t count) {
    switch (decide(fd, count)) {
    case FAIL_EINTR: errno = EINTR; return -1;
    case WRITE_HALF: return real_write()(fd, buffer, count / 2);
    case PASS: break;
    }
    return real_write()(fd, buffer, count);
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    switch (decide(fd, count)) {
    case FAIL_EINTR: errno = EINTR; return -1;
    case WRITE_HALF: return real_pwrite()(fd, buffer, count / 2, offset);
    case PASS: break;
    }
    return real_pwrite()(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off64_t offset) {
    switch (decide(fd, count)) {
    case FAIL_EINTR: errno = EINTR; return -1;
    case WRITE_HALF: return real_pwrite64()(fd, buffer, count / 2, offset);
    case PASS: break;
    }
    return real_pwrite64()(fd, buffer, count, offset);
}

/* Appends the counts to STITCH_SHIM_REPORT with the real write (so the report itself is never faulted). */
__attribute__((destructor)) static void shim_report(void) {
    const char *path = getenv("STITCH_SHIM_REPORT");
    if (!path || !*path) return;
    char line[160];
    int length = snprintf(line, sizeof line, "eintr=%lu short=%lu calls=%lu pid=%ld\n", atomic_load(&eintrs),
                          atomic_load(&shorts), atomic_load(&calls), (long)getpid());
    if (length <= 0 || (size_t)length >= sizeof line) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    write_fn fn = real_write();
    size_t done = 0;
    while (done < (size_t)length) {
        ssize_t n = fn(fd, line + done, (size_t)length - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    close(fd);
}
