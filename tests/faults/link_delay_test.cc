#include "faults/link_delay.h"

#include <gtest/gtest.h>

#include <string>

namespace chorus::faults {
namespace {

using std::chrono::microseconds;

TEST(LinkDelay, NoneAndZeroDelayNothing) {
  for (const char* text : {"", "none", "0", "0,0"}) {
    EXPECT_TRUE(LinkDelay::read(text).value().empty()) << text;
  }
}

TEST(LinkDelay, DelayAndJitterAreMilliseconds) {
  LinkDelay link = LinkDelay::read("20").value();
  EXPECT_EQ(link.delay, microseconds(20'000));
  EXPECT_EQ(link.jitter, microseconds(0));
  link = LinkDelay::read("0.5,2.25").value();
  EXPECT_EQ(link.delay, microseconds(500));
  EXPECT_EQ(link.jitter, microseconds(2'250));
  EXPECT_FALSE(link.empty());
  EXPECT_EQ(link.text, "0.5,2.25");
  EXPECT_EQ(LinkDelay::read("0,3").value().jitter, microseconds(3'000));  // jitter alone is a delay
  EXPECT_FALSE(LinkDelay::read("0,3").value().empty());
}

TEST(LinkDelay, GarbageIsRefusedWithTheAcceptedForms) {
  for (const char* text :
       {"abc", "20ms", "-1", "20,", ",5", "20,5,1", "nan", "inf", "10001", "1,10001", " 20"}) {
    const auto read = LinkDelay::read(text);
    ASSERT_FALSE(read.ok()) << "accepted '" << text << "'";
    const std::string& message = read.message();
    EXPECT_NE(message.find(std::string("'") + text + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("MS,JITTER_MS"), std::string::npos) << message;
  }
}

TEST(LinkLoss, ProbabilityAndTimeOut) {
  for (const char* text : {"", "none", "0", "0,50"}) {
    EXPECT_TRUE(LinkLoss::read(text).value().empty()) << text;
  }
  LinkLoss loss = LinkLoss::read("0.01").value();
  EXPECT_DOUBLE_EQ(loss.probability, 0.01);
  EXPECT_EQ(loss.rto, microseconds(200'000));  // Linux's smallest retransmission time-out
  EXPECT_FALSE(loss.empty());
  loss = LinkLoss::read("0.5,2.5").value();
  EXPECT_DOUBLE_EQ(loss.probability, 0.5);
  EXPECT_EQ(loss.rto, microseconds(2'500));
  EXPECT_EQ(loss.text, "0.5,2.5");
}

TEST(LinkLoss, GarbageIsRefusedWithTheAcceptedForms) {
  for (const char* text : {"abc", "1%", "-0.1", "0.51", "1", "nan", "0.1,", ",200", "0.1,0",
                           "0.1,-5", "0.1,10001", "0.1,200,3", "0.1,0.0001", "0.1,inf"}) {
    const auto read = LinkLoss::read(text);
    ASSERT_FALSE(read.ok()) << "accepted '" << text << "'";
    const std::string& message = read.message();
    EXPECT_NE(message.find(std::string("'") + text + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("P,RTO_MS"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace chorus::faults
