#ifndef STITCH_SYSTEM_SHIM_H
#define STITCH_SYSTEM_SHIM_H
/* Interfaces the platform's Swift module does not export. Linux is built and tested here; the other branches are
   written to their documentation and have not been compiled on this project's machines. */
#include <sys/xattr.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/stat.h>
#ifdef __linux__
#include <linux/falloc.h>
#endif

/* The commit the binary was built from, stamped by scripts/package.sh (-Xcc -DSTITCH_COMMIT='"…"', from
   `git describe`); "unknown" for a build that was not stamped. */
#ifndef STITCH_COMMIT
#define STITCH_COMMIT "unknown"
#endif
static inline const char *stitch_build_commit(void) { return STITCH_COMMIT; }

/* Reserves blocks for [offset, offset+length) without changing the file size; -1 with errno ENOTSUP where the
   platform has no such call (the caller then writes without a reservation). */
static inline int stitch_preallocate(int fd, long long offset, long long length) {
#ifdef __linux__
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
#elif defined(__APPLE__)
    /* F_PEOFPOSMODE reserves fst_length bytes past the blocks already allocated, so only what [0, offset+length)
       still lacks is asked for (a resumed download has most of its blocks already). */
    struct stat info;
    if (fstat(fd, &info) != 0) return -1;
    long long want = offset + length - (long long)info.st_blocks * 512;
    if (want <= 0) return 0;
    fstore_t store = {F_ALLOCATECONTIG | F_ALLOCATEALL, F_PEOFPOSMODE, 0, want, 0};
    if (fcntl(fd, F_PREALLOCATE, &store) == 0) return 0;
    store.fst_flags = F_ALLOCATEALL;
    return fcntl(fd, F_PREALLOCATE, &store) == -1 ? -1 : 0;
#else
    (void)fd; (void)offset; (void)length;
    errno = ENOTSUP;
    return -1;
#endif
}

/* Aligned 64-bit release store / acquire load, for the shared-memory written record (its words are read by
   the checkpoint thread while the transport thread stores them). */
#include <stdint.h>
static inline void stitch_store_release_i64(int64_t *pointer, int64_t value) {
    __atomic_store_n(pointer, value, __ATOMIC_RELEASE);
}
static inline int64_t stitch_load_acquire_i64(const int64_t *pointer) {
    return __atomic_load_n(pointer, __ATOMIC_ACQUIRE);
}
/* The calling thread's kernel id (gettid needs _GNU_SOURCE; syscall is variadic). */
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
static inline int32_t stitch_thread_id(void) {
    return (int32_t)syscall(SYS_gettid);
}
#endif
/* posix_spawn extensions (glibc >= 2.34) that <spawn.h> declares only under _GNU_SOURCE; the test support's
   child processes use them to start in a folder and to inherit no descriptor but 0, 1 and 2. */
#include <spawn.h>
extern int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *__restrict actions,
                                                const char *__restrict path);
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
static inline int stitch_spawn_add_chdir(posix_spawn_file_actions_t *actions, const char *path) {
    return posix_spawn_file_actions_addchdir_np(actions, path);
}
static inline int stitch_spawn_add_closefrom(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

/* The size of the terminal on `fd` (TIOCGWINSZ; ioctl is variadic, so Swift cannot call it). 0 on success. */
#include <sys/ioctl.h>
static inline int stitch_terminal_size(int fd, int *columns, int *rows) {
    struct winsize size;
    if (ioctl(fd, TIOCGWINSZ, &size) != 0) return -1;
    *columns = size.ws_col;
    *rows = size.ws_row;
    return 0;
}

/* The test support's deterministic file contents: a SplitMix64 stream, each value's 8 bytes little-endian, the
   last value cut short. In C because the Swift loop, in a debug build, held a thread of the tests' concurrency
   pool for seconds per 64 MiB. */
#include <stddef.h>
#include <string.h>
static inline void stitch_splitmix_fill(uint8_t *out, size_t count, uint64_t seed) {
    uint64_t state = seed;
    size_t offset = 0;
    while (offset < count) {
        state += 0x9E3779B97F4A7C15ULL;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z = z ^ (z >> 31);
        uint8_t bytes[8];
        for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(z >> (8 * i));
        size_t take = count - offset < 8 ? count - offset : 8;
        memcpy(out + offset, bytes, take);
        offset += take;
    }
}

#endif
