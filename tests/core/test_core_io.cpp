// core: mapped files, text file helpers, logging levels, progress formatting.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/progress.h"

namespace lilac {
namespace {

TEST(MappedFile, MapsContentsAndReportsErrors) {
  const std::string p = (std::filesystem::temp_directory_path() / ("lilac_map_" + std::to_string(::getpid()))).string();
  write_text_file(p, std::string("hello\0world", 11));
  {
    auto m = MappedFile::open(p);
    ASSERT_EQ(m->size(), 11u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), 11), std::string("hello\0world", 11));
    EXPECT_EQ(m->path(), p);
    m->prefetch(0, 11);
  }
  EXPECT_EQ(read_text_file(p), std::string("hello\0world", 11));
  EXPECT_TRUE(file_exists(p));
  write_text_file(p, "");
  EXPECT_EQ(MappedFile::open(p)->size(), 0u);  // empty file maps to nothing, no error
  std::filesystem::remove(p);
  EXPECT_FALSE(file_exists(p));
  try {
    MappedFile m(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open " + p), std::string::npos) << e.what();
  }
  EXPECT_THROW(MappedFile("/"), Error);  // a directory
  EXPECT_THROW(read_text_file("/nonexistent/x"), Error);
  EXPECT_EQ(path_join("a", "b"), "a/b");
  EXPECT_EQ(path_join("a/", "b"), "a/b");
}

TEST(Log, Levels) {
  LogLevel old = log_level();
  set_log_level(LogLevel::Warn);
  EXPECT_FALSE(log_enabled(LogLevel::Info));
  EXPECT_TRUE(log_enabled(LogLevel::Warn));
  EXPECT_TRUE(log_enabled(LogLevel::Error));
  set_log_level(LogLevel::Off);
  EXPECT_FALSE(log_enabled(LogLevel::Error));
  EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::Warn);
  EXPECT_THROW(parse_log_level("loud"), InputError);
  testing::internal::CaptureStderr();
  set_log_level(LogLevel::Info);
  LILAC_LOG_INFO("loaded %d tensors", 42);
  LILAC_LOG_DEBUG("hidden %d", 1);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "lilac [info] loaded 42 tensors\n");
  set_log_level(old);
}

TEST(Progress, FormatsAndStaysQuietWhenSmall) {
  EXPECT_EQ(Progress::format_bytes(512), "512 B");
  EXPECT_EQ(Progress::format_bytes(1.5e9), "1.50 GB");
  EXPECT_EQ(Progress::format_bytes(19.4e9), "19.40 GB");
  Progress p("x", 1000, true);  // below the 1 GB threshold: never active
  EXPECT_FALSE(p.active());
  p.add(400);
  p.add(600);
  EXPECT_EQ(p.done(), 1000u);
  p.finish();
}

}  // namespace
}  // namespace lilac
