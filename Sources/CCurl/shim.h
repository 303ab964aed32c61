#ifndef STITCH_CCURL_SHIM_H
#define STITCH_CCURL_SHIM_H

#include <curl/curl.h>
#include <stddef.h>

/*
 * curl_easy_setopt, curl_easy_getinfo and curl_multi_setopt are variadic, which Swift cannot
 * call. These non-variadic wrappers fix the type of the third argument per option family.
 */

typedef size_t (*stitch_curl_data_callback)(char *ptr, size_t size, size_t nmemb, void *userdata);
typedef int (*stitch_curl_xferinfo_callback)(void *clientp, curl_off_t dltotal, curl_off_t dlnow,
                                             curl_off_t ultotal, curl_off_t ulnow);

static inline CURLcode stitch_easy_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_off(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_data_callback(CURL *handle, CURLoption option,
                                                        stitch_curl_data_callback value) {
    return curl_easy_setopt(handle, option, value);
}

static inline CURLcode stitch_easy_setopt_xferinfo_callback(CURL *handle, stitch_curl_xferinfo_callback value) {
    return curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, value);
}

static inline CURLcode stitch_easy_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLcode stitch_easy_getinfo_off(CURL *handle, CURLINFO info, curl_off_t *value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLcode stitch_easy_getinfo_string(CURL *handle, CURLINFO info, char **value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLcode stitch_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLMcode stitch_multi_setopt_long(CURLM *handle, CURLMoption option, long value) {
    return curl_multi_setopt(handle, option, value);
}

/* CURLMsg.data is a union; Swift imports it awkwardly. */
static inline CURLcode stitch_msg_result(const CURLMsg *msg) {
    return msg->data.result;
}

#endif
